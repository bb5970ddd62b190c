#!/usr/bin/python3
"""load_bench.py: load-aware routing under a bursty workload over workers
of unequal speed: smg-c with round_robin, power_of_two and least_load, and
HAProxy with `balance leastconn`, in one run on one machine.

Two smg-simworkers serve every target: a fast one and a slow one whose
prefill rate is half the fast one's and whose decode step takes twice as
long, both with the same running-batch limit, so work queues on the slow
worker once it gets its share. The workload is open loop and bursty: a
burst of --burst streamed /v1/completions requests arrives at once every
--period seconds, --bursts times, prompts of random length (distinct text,
so no prefix-cache hits) and random max_tokens, the same sequence (fixed
--seed) for every target. The workers are restarted for every target so
each starts cold.

Per target: mean and p99 time to first token (first SSE event), mean and
p99 end-to-end latency, throughput (output tokens/s over the run), the
split of requests between the workers, and errors. Prints a Markdown report
(also written to --out), including how much least_load beats round_robin on
p99 TTFT. Standard library only; ports are picked free; every process
started is stopped on exit.

usage: /usr/bin/python3 tests/bench/load_bench.py [--build-dir DIR]
           [--bursts N] [--burst N] [--period S] [--out FILE]
"""
import argparse
import datetime
import http.client
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time

from benchlib import (Procs, free_port, haproxy_conf, http_call, logger,
                      machine, md_table, percentile, smg_ready,
                      start_haproxy, start_simworker, start_smg as spawn_smg,
                      wait_for, wait_port)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = "sim-model"
TARGETS = ("round_robin", "power_of_two", "least_load", "haproxy")
TITLES = {"round_robin": "smg-c round_robin",
          "power_of_two": "smg-c power_of_two",
          "least_load": "smg-c least_load",
          "haproxy": "HAProxy leastconn"}
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet "
         "kilo lima mike november oscar papa quebec romeo sierra tango "
         "uniform victor whiskey xray yankee zulu").split()


log = logger("load_bench")


def start_workers(procs, build, fast_args, slow_args):
    out = []
    for name, extra in (("fast", fast_args), ("slow", slow_args)):
        p, port = start_simworker(
            procs, os.path.join(build, "smg-simworker"), name,
            ["--model", MODEL, "--worker-id", name, *extra])
        wait_for(lambda: http_call(port, "GET", "/health", timeout=2.0)[0]
                 == 200, 10, f"{name} /health", p)
        out.append((name, port, p))
    return out


def start_smg(procs, build, policy, workers):
    urls = [f"http://127.0.0.1:{w[1]}" for w in workers]
    p, port, _ = spawn_smg(
        procs, os.path.join(build, "smg"), f"smg-{policy}",
        ["--frontends", "1", "--policy", policy,
         "--load-monitor-interval", "1", "--log-level", "warn",
         "--worker-urls", *urls], host="127.0.0.1")
    wait_for(lambda: smg_ready(port, len(workers))[0], 20,
             "smg-c readiness", p)
    return port, p


def start_haproxy_leastconn(procs, workers):
    port = free_port()
    p = start_haproxy(procs, haproxy_conf(
        port, [(w[0], w[1]) for w in workers], 1, "load_bench.py",
        balance="leastconn", timeout="120s"))
    wait_port(port, 10, "haproxy port", p)
    return port, p


def workload(args):
    """The request sequence: list of bursts, each a list of bodies."""
    rnd = random.Random(args.seed)
    bursts = []
    for b in range(args.bursts):
        reqs = []
        for i in range(args.burst):
            n_words = rnd.randint(args.min_words, args.max_words)
            text = f"request {b}-{i} " + " ".join(
                rnd.choice(WORDS) for _ in range(n_words))
            reqs.append({"model": MODEL, "prompt": text, "stream": True,
                         "max_tokens": rnd.randint(args.min_out,
                                                   args.max_out)})
        bursts.append(reqs)
    return bursts


def one_request(port, body, salt, res):
    """Streams one completion; appends a result dict to res."""
    body = dict(body)
    body["prompt"] = f"{salt} {body['prompt']}"
    data = json.dumps(body).encode()
    t0 = time.monotonic()
    out = {"ok": False, "ttft": None, "e2e": None, "tokens": 0,
           "worker": None}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", body=data,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        out["worker"] = r.getheader("x-sim-worker")
        if r.status != 200:
            r.read()
            out["status"] = r.status
            return
        buf = b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            if out["ttft"] is None and b"data:" in buf + chunk:
                out["ttft"] = time.monotonic() - t0
            buf += chunk
        events = [ln for ln in buf.split(b"\n") if ln.startswith(b"data:")]
        out["tokens"] = sum(1 for e in events if b"[DONE]" not in e and
                            b'"text"' in e)
        out["ok"] = b"data: [DONE]" in buf
        out["e2e"] = time.monotonic() - t0
    except (OSError, http.client.HTTPException) as e:
        out["error"] = str(e)
    finally:
        conn.close()
        res.append(out)


def drive(port, bursts, period, salt):
    res = []
    threads = []
    start = time.monotonic()
    for k, burst in enumerate(bursts):
        due = start + k * period
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        for i, body in enumerate(burst):
            t = threading.Thread(target=one_request,
                                 args=(port, body, f"{salt}-{k}-{i}", res))
            t.start()
            threads.append(t)
    for t in threads:
        t.join(180)
    return res, time.monotonic() - start


def summarise(res, wall):
    ok = [r for r in res if r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    e2e = [r["e2e"] for r in ok]
    split = {}
    for r in ok:
        split[r["worker"]] = split.get(r["worker"], 0) + 1
    return {
        "n": len(res), "errors": len(res) - len(ok),
        "ttft_mean": sum(ttft) / len(ttft) if ttft else float("nan"),
        "ttft_p99": percentile(ttft, 0.99),
        "ttft_p50": percentile(ttft, 0.50),
        "e2e_mean": sum(e2e) / len(e2e) if e2e else float("nan"),
        "e2e_p99": percentile(e2e, 0.99),
        "tok_s": sum(r["tokens"] for r in ok) / wall if wall > 0 else 0,
        "req_s": len(ok) / wall if wall > 0 else 0,
        "split": split, "wall": wall,
    }


def report(args, cmd, results):
    m = machine(("haproxy",))
    L = []
    L.append(f"## Load-aware routing under a bursty workload "
             f"({datetime.date.today().isoformat()})")
    L.append("")
    L.append(f"- command: `{cmd}`")
    L.append(f"- machine: {m['arch']}, {m['cpus']} CPUs, "
             f"{m['platform']}; {m['haproxy']}")
    L.append(f"- workers (smg-simworker, restarted per target): fast "
             f"`{' '.join(args.fast)}`; slow `{' '.join(args.slow)}`")
    L.append(f"- workload: {args.bursts} bursts of {args.burst} streamed "
             f"/v1/completions every {args.period} s; prompts "
             f"{args.min_words}-{args.max_words} words, max_tokens "
             f"{args.min_out}-{args.max_out}; seed {args.seed}")
    L.append("- smg-c: `--load-monitor-interval 1`, one frontend; HAProxy "
             "`balance leastconn`, one thread")
    L.append("")
    rows = []
    for t in TARGETS:
        s = results.get(t)
        if s is None:
            rows.append([TITLES[t], "not run"] + [""] * 8)
            continue
        split = f"{s['split'].get('fast', 0)}/{s['split'].get('slow', 0)}"
        rows.append([TITLES[t]] +
                    [f"{s[k] * 1e3:.0f}" for k in ("ttft_mean", "ttft_p50",
                                                   "ttft_p99", "e2e_mean",
                                                   "e2e_p99")] +
                    [f"{s['tok_s']:.0f}", f"{s['req_s']:.1f}", split,
                     str(s["errors"])])
    L += md_table(["target", "TTFT mean (ms)", "TTFT p50 (ms)",
                   "TTFT p99 (ms)", "e2e mean (ms)", "e2e p99 (ms)",
                   "output tok/s", "req/s", "fast/slow", "errors"],
                  "lrrrrrrrlr", rows)
    L.append("")
    rr, ll = results.get("round_robin"), results.get("least_load")
    if rr and ll and ll["ttft_p99"] > 0:
        L.append(f"least_load vs round_robin, p99 TTFT: "
                 f"{rr['ttft_p99'] * 1e3:.0f} ms -> "
                 f"{ll['ttft_p99'] * 1e3:.0f} ms "
                 f"({rr['ttft_p99'] / ll['ttft_p99']:.2f}x lower, "
                 f"{(1 - ll['ttft_p99'] / rr['ttft_p99']) * 100:.0f}% less); "
                 f"mean TTFT {rr['ttft_mean'] * 1e3:.0f} -> "
                 f"{ll['ttft_mean'] * 1e3:.0f} ms.")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir",
                    default=os.path.join(ROOT, "build-load-rel"))
    ap.add_argument("--bursts", type=int, default=10)
    ap.add_argument("--burst", type=int, default=32)
    ap.add_argument("--period", type=float, default=2.0)
    ap.add_argument("--min-words", type=int, default=100)
    ap.add_argument("--max-words", type=int, default=600)
    ap.add_argument("--min-out", type=int, default=16)
    ap.add_argument("--max-out", type=int, default=96)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.fast = ["--max-running", "8", "--prefill-tps", "16000",
                 "--decode-base-ms", "5"]
    args.slow = ["--max-running", "8", "--prefill-tps", "8000",
                 "--decode-base-ms", "10"]
    build = os.path.abspath(args.build_dir)
    for b in ("smg", "smg-simworker"):
        if not os.path.exists(os.path.join(build, b)):
            sys.exit(f"{build}/{b} not built")
    targets = [t for t in args.targets.split(",") if t]
    if "haproxy" in targets and shutil.which("haproxy") is None:
        log("haproxy not installed: skipped")
        targets.remove("haproxy")
    tmp = tempfile.mkdtemp(prefix="smg-load-bench-")
    procs = Procs(tmp, log)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    bursts = workload(args)
    results = {}
    try:
        for t in targets:
            workers = start_workers(procs, build, args.fast, args.slow)
            if t == "haproxy":
                port, front = start_haproxy_leastconn(procs, workers)
            else:
                port, front = start_smg(procs, build, t, workers)
                time.sleep(2.5)  # first load reports in
            log(f"{t}: {args.bursts} bursts of {args.burst}")
            res, wall = drive(port, bursts, args.period, t)
            results[t] = summarise(res, wall)
            log(f"{t}: {json.dumps(results[t])}")
            procs.stop(front)
            for w in workers:
                procs.stop(w[2])
    finally:
        procs.stop_all()
    cmd = "/usr/bin/python3 tests/bench/load_bench.py " + \
        " ".join(sys.argv[1:])
    text = report(args, cmd.strip(), results)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
