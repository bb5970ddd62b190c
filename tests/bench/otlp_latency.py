#!/usr/bin/python3
"""What span export costs a request, and what a dead collector costs.

In one run, alternating ROUNDS times, one smg (1 frontend, round_robin,
one simworker at --time-scale 0) per target, each sent COUNT sequential
/generate requests on one keep-alive connection, every one carrying a
sampled client traceparent:
  off      no --enable-trace
  live     --enable-trace, a collector that answers 200 at once
  refused  --enable-trace, the collector's port closed
  hung     --enable-trace, a collector that accepts and never answers
The collectors run as processes of their own (not in this client's
interpreter). Client-side latency per request; per target the median over
rounds of p50 and p99, and each target's p99 minus live's and off's in
the same round (the host may be busy: a difference within one round
compares like with like).

usage: otlp_latency.py [--build-dir DIR] [--rounds N] [--count N]
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time

import benchlib

COLLECTOR = r"""
import http.server, sys, threading
hang = sys.argv[2] == "hang"
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if hang:
            threading.Event().wait()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
s = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
s.daemon_threads = True
s.serve_forever()
"""

BODY = json.dumps({"text": "hello there", "sampling_params":
                   {"max_new_tokens": 1}}).encode()


def measure(port, count):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    lat = []
    try:
        for i in range(count):
            tp = f"00-{i + 1:032x}-00f067aa0ba902b7-01"
            t0 = time.perf_counter()
            conn.request("POST", "/generate", body=BODY, headers={
                "Content-Type": "application/json", "traceparent": tp})
            r = conn.getresponse()
            r.read()
            lat.append(time.perf_counter() - t0)
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
    finally:
        conn.close()
    return lat


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_build_dir(ap, "smg and smg-simworker")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=3000)
    a = ap.parse_args()
    smg = os.path.join(a.build_dir, "smg")
    simw = os.path.join(a.build_dir, "smg-simworker")
    benchlib.trap_signals()
    tmp = tempfile.mkdtemp(prefix="otlp-bench-")
    procs = benchlib.Procs(tmp)
    try:
        _, wport = benchlib.start_simworker(procs, simw, "sim",
                                            ["--time-scale", "0"])
        live, hung, refused = (benchlib.free_port() for _ in range(3))
        procs.start("collector-live",
                    [sys.executable, "-c", COLLECTOR, str(live), "ok"])
        procs.start("collector-hung",
                    [sys.executable, "-c", COLLECTOR, str(hung), "hang"])
        benchlib.wait_port(live, 10, "live collector")
        benchlib.wait_port(hung, 10, "hung collector")
        targets = {
            "off": [],
            "live": ["--enable-trace", "--otlp-traces-endpoint",
                     f"127.0.0.1:{live}"],
            "refused": ["--enable-trace", "--otlp-traces-endpoint",
                        f"127.0.0.1:{refused}"],
            "hung": ["--enable-trace", "--otlp-traces-endpoint",
                     f"127.0.0.1:{hung}"],
        }
        ports = {}
        for name, extra in targets.items():
            p, port, prom = benchlib.start_smg(
                procs, smg, f"smg-{name}",
                ["--frontends", "1", "--policy", "round_robin",
                 "--worker-urls", f"http://127.0.0.1:{wport}", *extra])
            benchlib.wait_for(lambda: benchlib.smg_ready(port, 1)[0], 30,
                              f"smg {name} ready", p)
            ports[name] = (port, prom)
        for name, (port, _) in ports.items():
            measure(port, 200)  # warm-up: pools, caches
        res = {n: [] for n in targets}
        for rnd in range(a.rounds):
            for name, (port, _) in ports.items():
                lat = measure(port, a.count)
                row = {"round": rnd, "target": name,
                       "p50_us": benchlib.percentile(lat, 0.50) * 1e6,
                       "p99_us": benchlib.percentile(lat, 0.99) * 1e6}
                res[name].append(row)
                print(json.dumps(row), flush=True)
        print(f"\n{'target':8} {'p50 us':>8} {'p99 us':>8} "
              f"{'p99-live':>9} {'p99-off':>8}")
        for name in targets:
            p50 = statistics.median(r["p50_us"] for r in res[name])
            p99 = statistics.median(r["p99_us"] for r in res[name])
            dl = statistics.median(r["p99_us"] - q["p99_us"] for r, q in
                                   zip(res[name], res["live"]))
            do = statistics.median(r["p99_us"] - q["p99_us"] for r, q in
                                   zip(res[name], res["off"]))
            print(f"{name:8} {p50:8.0f} {p99:8.0f} {dl:9.0f} {do:8.0f}")
        for name, (_, prom) in ports.items():
            st, _, data = benchlib.http_call(prom, "GET", "/metrics")
            drops = [ln for ln in data.decode().splitlines()
                     if ln.startswith("smg_trace_spans_")]
            print(name, "; ".join(drops) or "no span counters")
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
