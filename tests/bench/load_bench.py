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
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

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


def log(msg):
    print(f"[load_bench] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Procs:
    """Processes of the run, each in its own process group."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []

    def start(self, name, argv):
        out = open(os.path.join(self.tmp, name + ".log"), "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL,
                             start_new_session=True)
        out.close()
        p.bench_name = name
        self.procs.append(p)
        return p

    def stop(self, p, grace=5.0):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log(f"{p.bench_name} (pid {p.pid}) did not exit")
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        for p in list(reversed(self.procs)):
            self.stop(p)


def http_get(port, path, timeout=2.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def wait_for(pred, timeout, what, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited {proc.returncode}")
        try:
            if pred():
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def start_workers(procs, build, tmp, fast_args, slow_args):
    out = []
    for name, extra in (("fast", fast_args), ("slow", slow_args)):
        pf = os.path.join(tmp, f"{name}.port")
        if os.path.exists(pf):
            os.unlink(pf)
        p = procs.start(name, [os.path.join(build, "smg-simworker"),
                               "--port", "0", "--port-file", pf,
                               "--model", MODEL, "--worker-id", name,
                               *extra])
        wait_for(lambda: os.path.exists(pf) and
                 open(pf).read().strip() != "", 10, f"{name} port", p)
        port = int(open(pf).read().strip())
        wait_for(lambda: http_get(port, "/health")[0] == 200, 10,
                 f"{name} /health", p)
        out.append((name, port, p))
    return out


def start_smg(procs, build, tmp, policy, workers):
    port, mport = free_port(), free_port()
    run = tempfile.mkdtemp(prefix="run-", dir=tmp)
    state = tempfile.mkdtemp(prefix="state-", dir=tmp)
    p = procs.start(f"smg-{policy}", [
        os.path.join(build, "smg"), "--host", "127.0.0.1",
        "--port", str(port), "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(mport), "--run-dir", run,
        "--state-dir", state, "--frontends", "1", "--policy", policy,
        "--load-monitor-interval", "1", "--log-level", "warn",
        "--worker-urls", *[f"http://127.0.0.1:{w[1]}" for w in workers]])

    def ready():
        st, body = http_get(port, "/readiness")
        return st == 200 and json.loads(body)["healthy_workers"] == 2
    wait_for(ready, 20, "smg-c readiness", p)
    return port, p


def haproxy_conf(port, workers):
    srv = "\n".join(f"    server {w[0]} 127.0.0.1:{w[1]}" for w in workers)
    return f"""# generated by tests/bench/load_bench.py
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend bench
    bind 127.0.0.1:{port}
    default_backend workers
backend workers
    balance leastconn
{srv}
"""


def start_haproxy(procs, tmp, workers):
    port = free_port()
    cfg = os.path.join(tmp, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write(haproxy_conf(port, workers))
    p = procs.start("haproxy", ["haproxy", "-db", "-f", cfg])
    wait_for(lambda: socket.create_connection(("127.0.0.1", port), 1)
             .close() is None, 10, "haproxy port", p)
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


def pct(vals, q):
    if not vals:
        return float("nan")
    s = sorted(vals)
    k = max(0, min(len(s) - 1, int(round(q * (len(s) - 1)))))
    return s[k]


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
        "ttft_p99": pct(ttft, 0.99), "ttft_p50": pct(ttft, 0.50),
        "e2e_mean": sum(e2e) / len(e2e) if e2e else float("nan"),
        "e2e_p99": pct(e2e, 0.99),
        "tok_s": sum(r["tokens"] for r in ok) / wall if wall > 0 else 0,
        "req_s": len(ok) / wall if wall > 0 else 0,
        "split": split, "wall": wall,
    }


def first_line(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=5)
        return (p.stdout or p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def report(args, cmd, results):
    L = []
    L.append(f"## Load-aware routing under a bursty workload "
             f"({datetime.date.today().isoformat()})")
    L.append("")
    L.append(f"- command: `{cmd}`")
    L.append(f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, "
             f"{platform.platform()}; {first_line(['haproxy', '-v'])}")
    L.append(f"- workers (smg-simworker, restarted per target): fast "
             f"`{' '.join(args.fast)}`; slow `{' '.join(args.slow)}`")
    L.append(f"- workload: {args.bursts} bursts of {args.burst} streamed "
             f"/v1/completions every {args.period} s; prompts "
             f"{args.min_words}-{args.max_words} words, max_tokens "
             f"{args.min_out}-{args.max_out}; seed {args.seed}")
    L.append("- smg-c: `--load-monitor-interval 1`, one frontend; HAProxy "
             "`balance leastconn`, one thread")
    L.append("")
    L.append("| target | TTFT mean (ms) | TTFT p50 (ms) | TTFT p99 (ms) | "
             "e2e mean (ms) | e2e p99 (ms) | output tok/s | req/s | "
             "fast/slow | errors |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for t in TARGETS:
        s = results.get(t)
        if s is None:
            L.append(f"| {TITLES[t]} | not run | | | | | | | | |")
            continue
        split = f"{s['split'].get('fast', 0)}/{s['split'].get('slow', 0)}"
        L.append(f"| {TITLES[t]} | {s['ttft_mean'] * 1e3:.0f} | "
                 f"{s['ttft_p50'] * 1e3:.0f} | {s['ttft_p99'] * 1e3:.0f} | "
                 f"{s['e2e_mean'] * 1e3:.0f} | {s['e2e_p99'] * 1e3:.0f} | "
                 f"{s['tok_s']:.0f} | {s['req_s']:.1f} | {split} | "
                 f"{s['errors']} |")
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
    procs = Procs(tmp)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    bursts = workload(args)
    results = {}
    try:
        for t in targets:
            workers = start_workers(procs, build, tmp, args.fast, args.slow)
            if t == "haproxy":
                port, front = start_haproxy(procs, tmp, workers)
            else:
                port, front = start_smg(procs, build, tmp, t, workers)
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
