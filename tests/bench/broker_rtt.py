#!/usr/bin/python3
"""The decision round trip, one request at a time, beside its floor.

In one run, alternating ROUNDS times:
  socketpair  bench-pingpong (two processes, blocking reads), 256 B
  sp          bench-ipc-rtt --transport sp: shared/ipc.h REQ -> REP echo,
              both on libev loops (the frontend-broker transport)
  sp-tcp      the same over tcp:// on loopback (remote frontends)
  sp-tls      the same over tls+tcp:// with mutual certificates
  nng         bench-ipc-rtt --transport nng: libnng REQ/REP with contexts
              and ev_async, the transport before sp.c
  gateway     smg (1 frontend, round_robin, a simworker --time-scale 0):
              sequential /generate requests; smg_broker_round_trip_seconds
              read from fine histogram buckets (bucket upper bounds)
  gateway-tcp the same through a frontend of another run dir ("host")
              that reaches the broker over --broker tcp://127.0.0.1:PORT
  gateway-tls the same over tls+tcp:// with mutual certificates
  sp-8k, sp-tcp-8k, sp-tls-8k
              bench-ipc-rtt with an 8 KiB message each way
  real, real-tcp, real-tls
              the three gateway runs with a realistic decision: policy
              cache_aware and /generate texts of --prompt-bytes (one of
              four shared system prompts of half that, then a text of
              its own), so the broker's tree work and the routing text's
              trip are in the round trip

usage: broker_rtt.py [--build-dir DIR] [--rounds N] [--count N]
                     [--gateway-count N] [--real-count N]
                     [--prompt-bytes N]
Prints one JSON object per measurement, then each transport's median
p50/p99 and the median of its per-round ratios to the socketpair and to
its ipc:// counterpart (the host may be busy: a ratio within one round
compares like with like).
"""
import argparse
import http.client
import json
import os
import pathlib
import random
import re
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "system"))

# At most 24 bounds (METRICS_MAX_BUCKETS): 2 us steps where the p50s of
# ipc://, tcp:// and tls+tcp:// fall.
BUCKETS = ("0.000014,0.000016,0.000018,0.00002,0.000022,0.000024,"
           "0.000026,0.000028,0.00003,0.000032,0.000034,0.000036,"
           "0.000038,0.00004,0.000043,0.000046,0.00005,0.000055,0.00006,"
           "0.00007,0.0001,0.0002,0.001,0.005")
# The realistic decision: 5 us steps from 35 us.
BUCKETS_REAL = ("0.000035,0.00004,0.000045,0.00005,0.000055,0.00006,"
                "0.000065,0.00007,0.000075,0.00008,0.000085,0.00009,"
                "0.000095,0.0001,0.000105,0.00011,0.00012,0.00013,0.00015,"
                "0.0002,0.0003,0.0005,0.001,0.005")

WORDS = ("the of and to in is that for it as was with be by on not he this "
         "are or his from at which but have an they you were her she there "
         "been one all we their has would when if so what out up more no "
         "model request token cache worker route prefix batch decode "
         "prefill system user assistant answer question context").split()


def prose(rng, nbytes):
    out, n = [], 0
    while n < nbytes:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:nbytes]


def real_texts(count, nbytes):
    """count /generate texts of nbytes: one of four shared system
    prompts (half), then a text of its own (a Mooncake-like mix)."""
    rng = random.Random(7)
    systems = [prose(rng, nbytes // 2) for _ in range(4)]
    return [systems[i % 4] + " " + prose(rng, nbytes - nbytes // 2 - 1)
            for i in range(count)]


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


def certs(tmp):
    """CA, broker (localhost) and frontend certificates; the broker's and
    the frontend's --broker-tls-* arguments."""
    d = tmp / "certs"
    d.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]

    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True,
                       capture_output=True)
    ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt",
         "-subj", "/CN=rtt-ca", "-days", "2")
    (d / "ext.cnf").write_text("subjectAltName=DNS:localhost\n")
    for i, (name, cn) in enumerate((("brain", "localhost"),
                                    ("fe", "frontend"))):
        ossl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={cn}")
        ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt",
             "-CAkey", "ca.key", "-set_serial", str(i + 2), "-days", "2",
             "-extfile", "ext.cnf", "-out", f"{name}.crt")

    def args(name):
        return ["--broker-tls-cert", str(d / f"{name}.crt"),
                "--broker-tls-key", str(d / f"{name}.key"),
                "--broker-tls-ca", str(d / "ca.crt")]
    return args("brain"), args("fe")


def remote_frontend(tmp, burl, extra=(), buckets=BUCKETS):
    """One smg-frontend with a run dir of its own and --broker burl."""
    import util
    run = tmp / "remote" / "run"
    state = tmp / "remote" / "state"
    os.makedirs(run, mode=0o700)
    os.makedirs(state, mode=0o700)
    port, mport = util.free_port(), util.free_port()
    p = util.Proc("remote", [util.binary("smg-frontend"),
                             "--host", "127.0.0.1", "--port", str(port),
                             "--prometheus-host", "127.0.0.1",
                             "--prometheus-port", str(mport),
                             "--prometheus-duration-buckets", buckets,
                             "--run-dir", str(run), "--state-dir",
                             str(state), "--frontends", "1",
                             "--frontend-slot", "0", "--broker", burl,
                             *extra],
                  tmp)

    def ready():
        try:
            r = util.get(port, "/readiness", timeout=2)
        except OSError:
            return None
        return r.status == 200 or None
    util.wait_for(ready, timeout=30, what="the remote frontend ready")
    return p, port, mport


def gateway(count, remote=None, texts=None):
    """remote: None (the gateway's own frontend), "tcp" or "tls". texts:
    the realistic decision (cache_aware, these texts in turn), else
    round_robin and a short text."""
    import gw
    import sim
    import util
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="broker-rtt."))
    w = sim.start_simworker(tmp, "--time-scale", "0")
    port = util.free_port()
    burl = f"tcp://127.0.0.1:{port}"
    fe_url, bargs, fargs = burl, [], []
    if remote == "tls":
        burl = f"tls+tcp://127.0.0.1:{port}"
        fe_url = f"tls+tcp://localhost:{port}"
        bargs, fargs = certs(tmp)
    rp = None
    buckets = BUCKETS_REAL if texts else BUCKETS
    policy = "cache_aware" if texts else "round_robin"
    try:
        with gw.start_gateway(tmp, "--policy", policy,
                              "--worker-urls", w.url,
                              "--prometheus-duration-buckets",
                              buckets, "--broker-listen", burl,
                              *bargs) as g:
            g.wait_ready(1)
            port, mport = g.port, g.metrics_port
            if remote:
                rp, port, mport = remote_frontend(tmp, fe_url, fargs,
                                                  buckets)
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            bodies = [json.dumps({"text": t,
                                  "sampling_params": {"max_new_tokens": 1}})
                      for t in (texts or ["hello " * 40])]
            for i in range(count):
                c.request("POST", "/generate", bodies[i % len(bodies)],
                          {"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                assert r.status == 200, r.status
            m = util.get(mport, "/metrics").body.decode()
            if rp is not None:
                rp.stop()
                rp = None
            g.stop()
    finally:
        if rp is not None:
            rp.kill()
        w.stop()
    bk = sorted((float(le), int(v)) for le, v in re.findall(
        r'smg_broker_round_trip_seconds_bucket\{le="([0-9.e+-]+)"\} (\d+)',
        m))
    n = int(re.search(r"smg_broker_round_trip_seconds_count(?:\{\})? (\d+)",
                      m).group(1))
    fb = re.search(r"^smg_broker_fallback_decisions_total(?:\{\})? (\d+)",
                   m, re.M)
    name = "real" if texts else "gateway"
    return {"transport": f"{name}-{remote}" if remote else name,
            "count": n,
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
    ap.add_argument("--real-count", type=int, default=2000)
    ap.add_argument("--prompt-bytes", type=int, default=8192)
    a = ap.parse_args()
    texts = real_texts(a.real_count, a.prompt_bytes)
    os.environ["SMG_BUILD_DIR"] = a.build_dir
    b = pathlib.Path(a.build_dir)
    res = {}
    for _ in range(a.rounds):
        runs = [("socketpair", [str(b / "bench-pingpong"), "--count",
                                str(a.count)]),
                ("sp", [str(b / "bench-ipc-rtt"), "--transport", "sp",
                        "--count", str(a.count)]),
                ("sp-tcp", [str(b / "bench-ipc-rtt"), "--transport",
                            "sp-tcp", "--count", str(a.count)]),
                ("sp-tls", [str(b / "bench-ipc-rtt"), "--transport",
                            "sp-tls", "--count", str(a.count)]),
                ("nng", [str(b / "bench-ipc-rtt"), "--transport", "nng",
                         "--count", str(a.count)])]
        for t in ("sp", "sp-tcp", "sp-tls"):
            runs.append((f"{t}-8k", [str(b / "bench-ipc-rtt"), "--transport",
                                     t, "--size", "8192", "--count",
                                     str(a.count // 4)]))
        for name, argv in runs:
            r = run_json(argv)
            r["transport"] = name
            print(json.dumps(r), flush=True)
            res.setdefault(name, []).append(r)
        for remote in (None, "tcp", "tls"):
            r = gateway(a.gateway_count, remote)
            print(json.dumps(r), flush=True)
            res.setdefault(r["transport"], []).append(r)
        for remote in (None, "tcp", "tls"):
            r = gateway(a.real_count, remote, texts)
            print(json.dumps(r), flush=True)
            res.setdefault(r["transport"], []).append(r)
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
    # The question asked of TLS: how far from the same over ipc://.
    print(f"per-round ratio to the same over ipc://, median of {a.rounds} "
          f"rounds:")
    for ipc in ("sp", "sp-8k", "gateway", "real"):
        for kind in ("tcp", "tls"):
            if ipc.startswith("sp"):
                name = ipc.replace("sp", f"sp-{kind}", 1)
            else:
                name = f"{ipc}-{kind}"
            r50 = statistics.median(r["p50_us"] / i0["p50_us"]
                                    for r, i0 in zip(res[name], res[ipc]))
            r99 = statistics.median(r["p99_us"] / i0["p99_us"]
                                    for r, i0 in zip(res[name], res[ipc]))
            print(f"  {name:12s} / {ipc:8s} p50 {r50:5.2f}x  "
                  f"p99 {r99:5.2f}x")

if __name__ == "__main__":
    main()
