#!/usr/bin/python3
"""The decision round trip, one request at a time, beside its floor.

In one run, alternating ROUNDS times:
  socketpair  bench-pingpong (two processes, blocking reads), 256 B
  sp          bench-ipc-rtt --transport sp: shared/ipc.h REQ -> REP echo,
              both on libev loops (the frontend-broker transport)
  nng         bench-ipc-rtt --transport nng: libnng REQ/REP with contexts
              and ev_async, the transport before sp.c
  gateway     smg (1 frontend, round_robin, a simworker --time-scale 0):
              sequential /generate requests; smg_broker_round_trip_seconds
              read from fine histogram buckets (bucket upper bounds)

usage: broker_rtt.py [--build-dir DIR] [--rounds N] [--count N]
Prints one JSON object per measurement, then each transport's median
p50/p99 and the median of its per-round ratios to the socketpair (the host
may be busy: a ratio within one round compares like with like).
"""
import argparse
import http.client
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "system"))

# At most 24 bounds (METRICS_MAX_BUCKETS): 1 us steps where the p50 falls.
BUCKETS = ("0.00001,0.000012,0.000014,0.000016,0.000017,0.000018,0.000019,"
           "0.00002,0.000021,0.000022,0.000023,0.000024,0.000025,0.000027,"
           "0.00003,0.000035,0.00004,0.00005,0.00007,0.0001,0.0002,0.0005,"
           "0.001,0.005")


def run_json(argv):
    out = subprocess.run(argv, check=True, capture_output=True, text=True,
                         timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def quantile(buckets, q):
    total = buckets[-1][1]
    for le, c in buckets:
        if c >= q * total:
            return le
    return float("inf")


def gateway(count):
    import gw
    import sim
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="broker-rtt."))
    w = sim.start_simworker(tmp, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp, "--policy", "round_robin",
                              "--worker-urls", w.url,
                              "--prometheus-duration-buckets",
                              BUCKETS) as g:
            g.wait_ready(1)
            c = http.client.HTTPConnection("127.0.0.1", g.port, timeout=10)
            body = json.dumps({"text": "hello " * 40,
                               "sampling_params": {"max_new_tokens": 1}})
            for _ in range(count):
                c.request("POST", "/generate", body,
                          {"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                assert r.status == 200, r.status
            m = g.metrics()
            g.stop()
    finally:
        w.stop()
    bk = sorted((float(le), int(v)) for le, v in re.findall(
        r'smg_broker_round_trip_seconds_bucket\{le="([0-9.e+-]+)"\} (\d+)',
        m))
    n = int(re.search(r"smg_broker_round_trip_seconds_count(?:\{\})? (\d+)",
                      m).group(1))
    fb = re.search(r"^smg_broker_fallback_decisions_total(?:\{\})? (\d+)",
                   m, re.M)
    return {"transport": "gateway", "count": n,
            "p50_us": quantile(bk, 0.5) * 1e6,
            "p99_us": quantile(bk, 0.99) * 1e6,
            "fallback_decisions": int(fb.group(1)) if fb else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=os.environ.get(
        "SMG_BUILD_DIR", str(HERE.parent.parent / "build-release")))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--gateway-count", type=int, default=3000)
    a = ap.parse_args()
    os.environ["SMG_BUILD_DIR"] = a.build_dir
    b = pathlib.Path(a.build_dir)
    res = {}
    for _ in range(a.rounds):
        runs = [("socketpair", [str(b / "bench-pingpong"), "--count",
                                str(a.count)]),
                ("sp", [str(b / "bench-ipc-rtt"), "--transport", "sp",
                        "--count", str(a.count)]),
                ("nng", [str(b / "bench-ipc-rtt"), "--transport", "nng",
                         "--count", str(a.count)])]
        for name, argv in runs:
            r = run_json(argv)
            r["transport"] = name
            print(json.dumps(r), flush=True)
            res.setdefault(name, []).append(r)
        r = gateway(a.gateway_count)
        print(json.dumps(r), flush=True)
        res.setdefault("gateway", []).append(r)
    # Ratios within each round (same moment, same load), then medians.
    base = res["socketpair"]
    print(f"per-round ratio to the socketpair, median of {a.rounds} rounds "
          f"(socketpair p50 {statistics.median(r['p50_us'] for r in base):.1f}"
          f" us, p99 {statistics.median(r['p99_us'] for r in base):.1f} us):")
    for name, rs in res.items():
        r50 = statistics.median(r["p50_us"] / b0["p50_us"]
                                for r, b0 in zip(rs, base))
        r99 = statistics.median(r["p99_us"] / b0["p99_us"]
                                for r, b0 in zip(rs, base))
        p50 = statistics.median(r["p50_us"] for r in rs)
        p99 = statistics.median(r["p99_us"] for r in rs)
        print(f"  {name:10s} p50 {p50:8.1f} us ({r50:5.2f}x)  "
              f"p99 {p99:8.1f} us ({r99:5.2f}x)")

if __name__ == "__main__":
    main()
