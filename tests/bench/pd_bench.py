#!/usr/bin/python3
"""pd_bench.py: prefill routing under a bimodal prompt-length workload in
PD mode: smg-c with --prefill-policy bucket, round_robin and least_load, in
one run on one machine.

Two prefill and two decode smg-simworkers (--role prefill/decode, meeting
by bootstrap room in a shared directory) serve every target; they are
restarted for every target so each starts cold. The decode workers skip
the prompt's compute (--prefill-tps 1e9: the KV cache arrives from the
prefill), so the time to first token is the prefill leg's: its queueing
and its compute. The workload is open loop: --requests streamed
/v1/completions at --rate per second, half of them short (--short chars)
and half long (--long chars), in a random order fixed by --seed, distinct
text (no prefix-cache hits), the same sequence for every target.

Per target: p50 and p99 time to first token (first SSE event) over all
requests and per length class, the prompt tokens each prefill worker
computed, and errors. Prints a Markdown report (also to --out). Standard
library only; ports are picked free; every process started is stopped.

usage: /usr/bin/python3 tests/bench/pd_bench.py [--build-dir DIR]
           [--requests N] [--rate R] [--time-scale S] [--out FILE]
           [--policies P,...] [--log-level debug] [--dump PREFIX]
           [--gateway-arg ARG ...]
"""
import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
POLICIES = ("bucket", "round_robin", "least_load")
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet "
         "kilo lima mike november oscar papa quebec romeo sierra tango "
         "uniform victor whiskey xray yankee zulu").split()


def log(msg):
    print(f"[pd_bench] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path, timeout=5.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def text(n, rng):
    out, size = [], 0
    while size < n:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


class Procs:
    def __init__(self):
        self.procs = []

    def start(self, argv, log_path):
        f = open(log_path, "w")
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        self.procs.append((p, f))
        return p

    def stop_all(self):
        for p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, f in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            f.close()
        self.procs = []


def start_workers(procs, build, tmp, tag, scale):
    rdv = os.path.join(tmp, f"rdv-{tag}")
    os.makedirs(rdv, exist_ok=True)
    sim = os.path.join(build, "smg-simworker")
    prefill, decode = [], []
    for i in range(2):
        port, bport = free_port(), 9500 + i
        procs.start([sim, "--port", str(port), "--role", "prefill",
                     "--bootstrap-port", str(bport), "--bootstrap-dir", rdv,
                     "--time-scale", str(scale), "--worker-id", f"P{i}"],
                    os.path.join(tmp, f"{tag}-prefill{i}.log"))
        prefill.append((port, bport))
    for i in range(2):
        port = free_port()
        procs.start([sim, "--port", str(port), "--role", "decode",
                     "--bootstrap-dir", rdv, "--bootstrap-timeout", "60",
                     "--prefill-tps", "1e9", "--time-scale", str(scale),
                     "--worker-id", f"D{i}"],
                    os.path.join(tmp, f"{tag}-decode{i}.log"))
        decode.append(port)
    for port in [p for p, _ in prefill] + decode:
        wait_for(lambda: http_get(port, "/health")[0] == 200, 10,
                 f"simworker {port}")
    return prefill, decode


def one_request(port, body, out, sent):
    start = time.monotonic()
    ttft = None
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            r.read()
            out.append((None, r.status, sent))
            return
        while True:
            line = r.readline()
            if not line:
                break
            if ttft is None and line.startswith(b"data:"):
                ttft = time.monotonic() - start
        c.close()
        out.append((ttft, 200, sent))
    except OSError as e:
        out.append((None, str(e), sent))


def run_target(args, build, tmp, policy, workload):
    procs = Procs()
    try:
        prefill, decode = start_workers(procs, build, tmp, policy,
                                        args.time_scale)
        port, mport = free_port(), free_port()
        argv = [os.path.join(build, "smg"), "--host", "127.0.0.1",
                "--port", str(port), "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(mport),
                "--run-dir", os.path.join(tmp, f"run-{policy}"),
                "--state-dir", os.path.join(tmp, f"state-{policy}"),
                "--pd-disaggregation", "--policy", "round_robin",
                "--prefill-policy", policy, "--decode-policy", "round_robin",
                "--load-monitor-interval", "1",
                "--log-level", args.log_level] + args.gateway_arg
        for p, b in prefill:
            argv += ["--prefill", f"http://127.0.0.1:{p}", str(b)]
        for d in decode:
            argv += ["--decode", f"http://127.0.0.1:{d}"]
        procs.start(argv, os.path.join(tmp, f"{policy}-smg.log"))
        wait_for(lambda: http_get(port, "/readiness")[0] == 200, 30,
                 "gateway readiness")
        results = {"short": [], "long": []}
        threads = []
        t0 = time.monotonic()
        for i, (kind, prompt) in enumerate(workload):
            due = t0 + i / args.rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            body = {"model": "sim-model", "prompt": prompt,
                    "max_tokens": 4, "stream": True}
            t = threading.Thread(target=one_request,
                                 args=(port, body, results[kind],
                                       i / args.rate))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(180)
        tokens = []
        for p, _ in prefill:
            st = json.loads(http_get(p, "/sim/stats")[1])
            tokens.append(st["prompt_tokens"])
        return results, tokens
    finally:
        procs.stop_all()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.environ.get(
        "SMG_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--rate", type=float, default=24.0)
    ap.add_argument("--short", type=int, default=200)
    ap.add_argument("--long", type=int, default=6000)
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--log-level", default="info",
                    help="the gateway's --log-level (debug: the broker "
                    "logs every bucket decision and the ranges)")
    ap.add_argument("--out")
    ap.add_argument("--dump", metavar="PREFIX",
                    help="write PREFIX-<policy>.tsv: send time (s), class, "
                    "status, TTFT (s) per request")
    ap.add_argument("--gateway-arg", action="append", default=[],
                    metavar="ARG", help="one more gateway argument "
                    "(repeat; e.g. --gateway-arg=--balance-rel-threshold "
                    "--gateway-arg=1.0001)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    workload = []
    for _ in range(args.requests):
        kind = "short" if rng.random() < 0.5 else "long"
        n = args.short if kind == "short" else args.long
        n = int(n * rng.uniform(0.8, 1.2))
        workload.append((kind, text(n, rng)))
    tmp = tempfile.mkdtemp(prefix="pd-bench-")
    log(f"logs in {tmp}")
    rows = []
    for policy in args.policies.split(","):
        log(f"{policy}: {args.requests} requests at {args.rate}/s")
        results, tokens = run_target(args, args.build_dir, tmp, policy,
                                     workload)
        ok = {k: [t for t, s, _ in v if t is not None]
              for k, v in results.items()}
        errors = sum(1 for v in results.values() for t, s, _ in v
                     if t is None)
        if args.dump:
            with open(f"{args.dump}-{policy}.tsv", "w") as f:
                for kind, v in results.items():
                    for t, s, sent in v:
                        f.write(f"{sent:.3f}\t{kind}\t{s}\t"
                                f"{'' if t is None else f'{t:.4f}'}\n")
        both = ok["short"] + ok["long"]
        rows.append((policy, pct(both, 50), pct(both, 99),
                     pct(ok["short"], 50), pct(ok["short"], 99),
                     pct(ok["long"], 50), pct(ok["long"], 99), tokens,
                     errors))
    lines = [
        "# PD prefill routing: bimodal prompt lengths",
        "",
        f"{args.requests} streamed /v1/completions at {args.rate}/s, "
        f"half ~{args.short} chars, half ~{args.long} chars (±20 %), "
        f"2 prefill + 2 decode simworkers (--time-scale {args.time_scale}),"
        f" build {args.build_dir}. TTFT in ms, client side.",
        "",
        "| --prefill-policy | TTFT p50 | TTFT p99 | short p50 | short p99 "
        "| long p50 | long p99 | prompt tokens per prefill | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r[0]} | " + " | ".join(f"{x * 1000:.0f}" for x in r[1:7]) +
            f" | {r[7][0]} / {r[7][1]} | {r[8]} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
