#!/usr/bin/python3
"""multihost.py: does cache-aware routing keep its hits when the traffic
is spread over several frontend groups that share one broker, and what
does it lose with independent gateways instead?

The Mooncake synthetic trace (the whole of it unless --limit) is replayed
as streamed completions against four smg-simworkers configured as
routing.py's (16-token pages, LRU, a quarter of the trace's distinct
blocks each, --prefill-tps 10000 of model time, --time-scale 10), through
each configuration, with smg's cache_aware and its default flags
otherwise:

  single   one ordinary gateway (decisions over ipc://);
  tcpN     N remote frontend groups (`smg --broker tcp://...`, each its
           own run dir, so no shared memory between them) sharing the
           broker of one gateway (`--broker-listen tcp://...`); only the
           groups take traffic;
  tlsN     the same over tls+tcp:// with mutual certificates;
  indN     N independent gateways, each with its own broker and poller;
  rr       one gateway with round_robin: the reference the rate is set
           by (see below) and the hit rate of placement without routing.

Every gateway and group runs --frontends 1 (the host has 2 cores). With
N > 1 request i goes to target i mod N: each request is one connection,
so this is an L4 balancer's round robin over connections.

The rate: arrivals are scaled, as in routing.py, so that round robin is
predicted (an LRU simulation of its assignment) to keep the fleet at
--target-util prefill utilisation (default 80 %); the rr row measures it.
--rate R replaces that with R requests/s (wall) on average.

Per configuration: the cache hit rate (sum of cached_tokens over
prompt_tokens from the workers' GET /sim/stats) and its ratio to the
single gateway's, busiest/mean worker requests, TTFT p50/p99 (model
time), prefill utilisation, failures (at the client, and the gateways'
smg_router_request_errors_total / smg_broker_errors_total), the
frontends' fallback decisions (smg_broker_fallback_decisions_total) and
the decision round trip p50/p99 from their smg_broker_round_trip_seconds
histograms (buckets set with --prometheus-duration-buckets).

Standard library only (openssl for the tls certificates). Every process
started is stopped on exit, Ctrl-C and failure.
usage: /usr/bin/python3 tests/bench/multihost.py [--limit N] [--rate R]
       [--configs single,tcp8,...] [--out F]
"""
import argparse
import asyncio
import http.client
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

from benchlib import (Bodies, Fleet, Interrupted, NotAvailable, Procs,
                      add_build_dir, add_out, build_type, counter_delta,
                      finish, free_port, histogram_delta, histogram_quantile,
                      host_cpu, load_trace, logger, machine, md_table, probe,
                      refusal, replay, rusage_secs, scrape, smg_ready,
                      start_smg, trap_signals)
from routing import (DEFAULT_TRACE, WORKERS, figures, plan, stretch,
                     worker_args)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# Fine enough to resolve a loopback round trip, coarse enough to hold one
# on a saturated host.
RTT_BUCKETS = ("2.5e-05 5e-05 7.5e-05 0.0001 0.00015 0.0002 0.0003 0.0004 "
               "0.0005 0.0007 0.001 0.0015 0.002 0.003 0.005 0.008 0.012 "
               "0.02 0.05 0.1 0.5 5").split()  # METRICS_MAX_BUCKETS: 24
RTT_FAMILY = "smg_broker_round_trip_seconds"
FALLBACK_FAMILY = "smg_broker_fallback_decisions_total"
ERROR_FAMILIES = ("smg_router_request_errors_total",
                  "smg_broker_errors_total")
# Report order; RUN_ORDER runs the figures the target needs first.
CONFIGS = ("single", "tcp2", "tcp4", "tcp8", "tls8", "ind2", "ind4", "ind8",
           "rr")
RUN_ORDER = ("single", "tcp8", "ind8", "tls8", "tcp4", "ind4", "tcp2",
             "ind2", "rr")
log = logger()


def parse_config(name):
    """(kind, n): kind of single, tcp, tls, ind, rr."""
    m = re.fullmatch(r"(tcp|tls|ind)(\d+)", name)
    if m:
        return m.group(1), int(m.group(2))
    return name, 1


def describe_config(name):
    kind, n = parse_config(name)
    return {
        "single": "1 gateway, cache_aware",
        "rr": "1 gateway, round_robin",
        "tcp": f"{n} groups, one broker, tcp://",
        "tls": f"{n} groups, one broker, tls+tcp://",
        "ind": f"{n} independent gateways",
    }[kind]


def link(name):
    kind, _ = parse_config(name)
    return {"tcp": "tcp", "tls": "tls"}.get(kind, "ipc")


# ---------------------------------------------------------------- targets


def make_certs(d):
    """A CA, the broker's certificate for localhost and a frontend's, both
    signed by it (P-256); {file name: path}."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]

    def ossl(*a):
        subprocess.run(["openssl", *a], cwd=d, check=True,
                       capture_output=True, timeout=60)
    ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt",
         "-subj", "/CN=bench-ca", "-days", "2")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost\n")
    for serial, (name, cn) in enumerate((("brain", "localhost"),
                                         ("fe", "frontend")), 1):
        ossl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={cn}")
        ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt",
             "-CAkey", "ca.key", "-set_serial", str(serial), "-days", "2",
             "-extfile", "ext.cnf", "-out", f"{name}.crt")
    return {n: os.path.join(d, n) for n in os.listdir(d)}


def tls_flags(certs, side):
    return ["--broker-tls-cert", certs[f"{side}.crt"],
            "--broker-tls-key", certs[f"{side}.key"],
            "--broker-tls-ca", certs["ca.crt"]]


def common_flags(args, policy):
    return ["--policy", policy, "--frontends", str(args.frontends),
            "--log-level", "warn",
            "--prometheus-duration-buckets", *RTT_BUCKETS]


class Gateway:
    """One smg launcher (a gateway or a frontend-only group)."""

    def __init__(self, proc, port, prom, name):
        self.proc, self.port, self.prom, self.name = proc, port, prom, name


def start_gateway(args, procs, name, flags):
    """Starts smg with flags; does not wait."""
    p, port, prom = start_smg(procs, args.smg, name, flags, host="127.0.0.1")
    return Gateway(p, port, prom, name)


def wait_ready(args, procs, gw):
    """Waits until gw has WORKERS healthy workers (for a group: mirrored
    from the broker) and answers a streamed probe; NotAvailable if not."""
    logf = os.path.join(procs.tmp, gw.name + ".log")
    deadline = time.monotonic() + args.ready_timeout
    err = "not tried"
    while time.monotonic() < deadline:
        if gw.proc.poll() is not None:
            raise NotAvailable(refusal(logf) or f"{gw.name} exited with "
                               f"status {gw.proc.returncode}")
        try:
            ready, why = smg_ready(gw.port, WORKERS)
            if ready:
                err = probe(gw.port)
                if err is None:
                    return
            else:
                err = why
        except (OSError, http.client.HTTPException, ValueError) as e:
            err = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise NotAvailable(f"{gw.name}: not ready after "
                       f"{args.ready_timeout:.0f}s: {err}")


def start_config(args, procs, name, urls, certs):
    """The config's processes, ready: (gateways taking traffic, every
    gateway started)."""
    kind, n = parse_config(name)
    workers = ["--worker-urls"] + urls
    if kind in ("single", "rr"):
        policy = "round_robin" if kind == "rr" else "cache_aware"
        g = start_gateway(args, procs, f"{name}-gw",
                          common_flags(args, policy) + workers)
        wait_ready(args, procs, g)
        return [g], [g]
    if kind == "ind":
        gws = [start_gateway(args, procs, f"{name}-gw{i + 1}",
                             common_flags(args, "cache_aware") + workers)
               for i in range(n)]
        for g in gws:
            wait_ready(args, procs, g)
        return gws, gws
    bport = free_port()
    if kind == "tls":
        listen = [f"tls+tcp://127.0.0.1:{bport}"] + tls_flags(certs, "brain")
        url = [f"tls+tcp://localhost:{bport}"] + tls_flags(certs, "fe")
    else:
        listen = [f"tcp://127.0.0.1:{bport}"]
        url = [f"tcp://127.0.0.1:{bport}"]
    brain = start_gateway(args, procs, f"{name}-brain",
                          common_flags(args, "cache_aware") + workers +
                          ["--broker-listen"] + listen)
    wait_ready(args, procs, brain)
    groups = [start_gateway(args, procs, f"{name}-g{i + 1}",
                            common_flags(args, "cache_aware") +
                            ["--broker"] + url)
              for i in range(n)]
    for g in groups:
        wait_ready(args, procs, g)
    return groups, [brain] + groups


# ---------------------------------------------------------------- runs


def scrape_all(gws):
    out = []
    for g in gws:
        s = scrape(g.prom)
        if s is None:
            raise RuntimeError(f"{g.name}: /metrics unreachable")
        out.append(s)
    return out


def merged_rtt(before, after):
    """The round-trip histogram delta summed over gateways, or None."""
    total = {}
    count = 0.0
    for b, a in zip(before, after):
        h = histogram_delta(b, a, RTT_FAMILY)
        if h is None:
            continue
        count += h["count"]
        for le, c in h["buckets"]:
            total[le] = total.get(le, 0.0) + c
    if not total:
        return None
    return {"buckets": sorted(total.items()), "count": count}


def run_config(args, procs, info, reqs, bodies, name, certs):
    """Fresh fleet, the config's gateways, one replay; its figures."""
    children0 = rusage_secs(resource.RUSAGE_CHILDREN)
    rates = [args.prefill_tps] * WORKERS
    fleet = Fleet(procs, args.simworker, name,
                  [worker_args(args, info, r) for r in rates])
    started = []
    try:
        t0 = time.monotonic()
        targets, started = start_config(args, procs, name, fleet.urls(),
                                        certs)
        log(f"{name}: {len(started)} smg up in "
            f"{time.monotonic() - t0:.1f} s")
        fleet.reset()
        before = scrape_all(targets)
        host0 = host_cpu()
        results, wall, _ = asyncio.run(replay(
            [g.port for g in targets], reqs, bodies, args.time_scale,
            args.read_batch, args.request_timeout))
        host1 = host_cpu()
        stats = fleet.stats()
        after = scrape_all(targets)
        dead = fleet.dead() + [g.name for g in started
                               if g.proc.poll() is not None]
    finally:
        for g in reversed(started):
            procs.stop(g.proc)
        fleet.stop()
    f = figures(args, info, results, wall, stats, rates)
    f["dead"] = dead
    f["fallback"] = sum(counter_delta(b, a, FALLBACK_FAMILY) or 0.0
                        for b, a in zip(before, after))
    f["gw_errors"] = {fam: sum(counter_delta(b, a, fam) or 0.0
                               for b, a in zip(before, after))
                      for fam in ERROR_FAMILIES}
    f["rtt"] = merged_rtt(before, after)
    f["cpu_children"] = rusage_secs(resource.RUSAGE_CHILDREN) - children0
    f["host_busy"] = (host1[0] - host0[0]) / max(host1[1] - host0[1], 1e-9)
    return f


# ---------------------------------------------------------------- report


def ms(x):
    return "n/a" if x is None else f"{1000 * x:.0f}"


def rtt_cell(h):
    if h is None or h["count"] <= 0:
        return "n/a"
    cells = []
    for q in (0.5, 0.99):
        v, exact = histogram_quantile(q, h["buckets"])
        txt = f"{1e6 * v:.0f}" if v < 0.01 else f"{1e6 * v:,.0f}"
        cells.append(txt if exact else f">{txt}")
    return " / ".join(cells)


def rows(res, names):
    base = res.get("single")
    base_hit = base["hit"] if base and "unavailable" not in base else None
    out = []
    for name in names:
        r = res.get(name)
        if r is None or "unavailable" in r:
            why = "not run (interrupted)" if r is None else r["unavailable"]
            out.append([name, describe_config(name), link(name), why] +
                       [""] * 10)
            continue
        client_err = sum(r["errors"].values())
        gw_err = sum(r["gw_errors"].values())
        err = f"{client_err} / {gw_err:.0f}"
        if client_err or gw_err:
            err = "**" + err + "**"
        out.append([
            name, describe_config(name), link(name),
            f"{100 * r['hit']:.1f}%",
            "n/a" if not base_hit else f"{r['hit'] / base_hit:.3f}",
            f"{r['busiest']:.2f} ({'/'.join(map(str, r['counts']))})",
            ms(r["p50"]), ms(r["p99"]),
            f"{100 * r['util']:.0f}%/{100 * r['util_max']:.0f}%",
            err, f"{r['fallback']:.0f}",
            f"{r['rtt']['count']:.0f}" if r["rtt"] else "0",
            rtt_cell(r["rtt"]),
            f"{100 * r['host_busy']:.0f}% / {r['cpu_children']:.0f}"])
    head = ["config", "what", "link", "hit rate", "x single",
            "busiest / mean (requests)", "TTFT p50 ms", "TTFT p99 ms",
            "prefill util mean/max", "failures client / gw",
            "fallback decisions", "broker messages",
            "round trip p50 / p99 µs",
            "host busy / our CPU s"]
    return md_table(head, "llllrlrrllrrll", out)


def report(args, m, info, res, elapsed, names):
    L = ["# Multi-host: frontend groups sharing one broker\n"]
    L.append(f"- date: {m['date']}; commit {m['commit']}; build "
             f"`{os.path.relpath(args.build_dir, ROOT)}` ({args.build_type})")
    L.append(f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['kernel']}; "
             f"Python {m['python']}; load average at start {m['load']:.2f}; "
             f"whole run {elapsed / 60:.1f} min")
    L.append(f"- command: `{' '.join(args.argv)}`")
    if info is not None:
        L.append(f"- trace: `{os.path.relpath(args.trace, ROOT)}`, "
                 f"{'all ' if not args.limit else 'first '}{info['n']} "
                 f"requests, {info['prompt_tokens'] / 1e6:.1f} M prompt "
                 f"tokens (prompts {info['prompt_min']}-"
                 f"{info['prompt_max']}), max_tokens capped at "
                 f"{args.max_output}; **oracle {100 * info['oracle']:.1f}%**")
        rate = info["n"] / (info["span"] / args.time_scale)
        how = (f"--rate {args.rate:g}" if args.rate else
               f"round robin predicted at {100 * args.target_util:.0f}% "
               f"prefill utilisation (LRU simulation of its assignment, "
               f"{info['rr_uncached'] / 1e6:.1f} M uncached tokens)")
        L.append(f"- rate: trace time x {info['factor']:.3f} = "
                 f"{info['span']:.0f} s of model time, "
                 f"{info['span'] / args.time_scale:.0f} s wall, "
                 f"{rate:.1f} requests/s wall on average; set by {how}")
    L.append(f"- fleet: {WORKERS} smg-simworker, fresh for every row: "
             f"--page-size 16 (LRU), --kv-capacity "
             f"{info['kv_capacity'] if info else '?'} (a quarter of the "
             f"distinct blocks), --prefill-tps {args.prefill_tps:g} (model "
             f"time), --max-prefill-tokens {args.max_prefill_tokens}, "
             f"--decode-base-ms {args.decode_base_ms:g}, "
             f"--decode-per-req-ms {args.decode_per_req_ms:g}, "
             f"--time-scale {args.time_scale:g}")
    L.append(f"- smg: every gateway and group `--policy cache_aware "
             f"--frontends {args.frontends}`, default flags otherwise "
             f"(rr: round_robin); groups `smg --broker URL`, each its own "
             f"run and state dir; the broker's own gateway takes no "
             f"traffic in tcpN/tlsN; request i goes to target i mod N")
    L.append("")
    L += rows(res, names)
    L.append("")
    L += [
        "- hit rate: Σ cached_tokens / Σ prompt_tokens over the workers' "
        "GET /sim/stats; x single: over the single gateway's",
        "- busiest / mean: most requests one worker completed over the "
        "mean (w1/w2/w3/w4)",
        f"- TTFT: model time (wall x {args.time_scale:g}) from the "
        "scheduled send to the first SSE data event, at the client, "
        "successful requests",
        "- prefill util: uncached prompt tokens / (prefill rate x "
        "duration), fleet and busiest worker",
        "- failures: requests that failed at the client / the sum of "
        "smg_router_request_errors_total and smg_broker_errors_total "
        "over the frontends taking traffic",
        "- fallback decisions: smg_broker_fallback_decisions_total summed "
        "over the frontends taking traffic (a decision made on the local "
        "table because the broker did not answer); broker messages: the "
        "round trips those frontends timed",
        "- round trip: smg_broker_round_trip_seconds of those frontends "
        "(wall, one observation per broker message, which carries every "
        "decision ready in one loop turn), quantile interpolated in its "
        "bucket; link: ipc (same host), tcp, tls (tls+tcp://, mutual "
        "certificates)",
        "- host busy: both CPUs of the host during the replay, other work "
        "included; our CPU s: CPU seconds of every process the row "
        "started",
    ]
    single = res.get("single")
    if single and "unavailable" not in single:
        for name in ("tcp8", "tls8", "ind8"):
            r = res.get(name)
            if r and "unavailable" not in r:
                k = r["hit"] / single["hit"]
                verdict = ("target (>= 0.95x) met" if k >= 0.95 else
                           "**target (>= 0.95x) not met**") \
                    if name != "ind8" else "shown beside it"
                L.append(f"- {name}: {k:.3f}x the single gateway's hit "
                         f"rate: {verdict}")
    for name, r in res.items():
        if r.get("dead"):
            L.append(f"- **{name}: {', '.join(r['dead'])} exited during "
                     f"the run**")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- main


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Mooncake replay through one gateway, frontend groups "
                    "sharing one broker, and independent gateways.")
    add_build_dir(ap, "holds smg and smg-simworker")
    add_out(ap)
    ap.add_argument("--trace", default=DEFAULT_TRACE)
    ap.add_argument("--limit", type=int, default=0,
                    help="replay the first N requests only (0: all)")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="mean requests/s (wall) instead of the round "
                         "robin calibration")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated: single, rr, tcpN, tlsN, indN")
    ap.add_argument("--target-util", type=float, default=0.8,
                    help="round robin's predicted prefill utilisation")
    ap.add_argument("--frontends", type=int, default=1,
                    help="frontends of every gateway and group")
    ap.add_argument("--prefill-tps", type=float, default=10000)
    ap.add_argument("--time-scale", type=float, default=10)
    ap.add_argument("--decode-base-ms", type=float, default=10)
    ap.add_argument("--decode-per-req-ms", type=float, default=0.1)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--max-prefill-tokens", type=int, default=16384)
    ap.add_argument("--max-output", type=int, default=32,
                    help="cap on a request's max_tokens")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--read-batch", type=float, default=0.05)
    ap.add_argument("--ready-timeout", type=float, default=30.0)
    ap.add_argument("--keep-tmp", action="store_true")
    args = ap.parse_args(argv)
    args.argv = ["/usr/bin/python3",
                 os.path.relpath(os.path.abspath(__file__), os.getcwd())] + \
        argv
    names = [x.strip() for x in args.configs.split(",") if x.strip()]
    for x in names:
        kind, n = parse_config(x)
        if kind not in ("single", "rr", "tcp", "tls", "ind") or n < 1:
            ap.error(f"unknown configuration {x!r}")
    args.names = names
    if args.limit < 0 or args.rate < 0 or args.frontends < 1 or \
            not 0 < args.target_util <= 2:
        ap.error("--limit, --rate >= 0; --frontends >= 1; "
                 "0 < --target-util <= 2")
    args.build_dir = os.path.abspath(args.build_dir)
    args.build_type = build_type(args.build_dir)
    args.smg = os.path.join(args.build_dir, "smg")
    args.simworker = os.path.join(args.build_dir, "smg-simworker")
    for b in (args.smg, args.simworker):
        if not os.access(b, os.X_OK):
            ap.error(f"{b}: not found; build it first "
                     f"(BUILD_TYPE=Release ./scripts/build.sh)")
    if not os.path.isfile(args.trace):
        ap.error(f"{args.trace}: no such trace (--trace)")
    return args


def workload(args):
    reqs = load_trace(args.trace, args.limit)
    t0 = reqs[0]["timestamp"]
    reqs = [{"timestamp": r["timestamp"] - t0,
             "input_length": r["input_length"],
             "output_length": r["output_length"],
             "hash_ids": r["hash_ids"]} for r in reqs]
    info = plan(args, "mooncake", reqs, WORKERS * args.prefill_tps)
    if args.rate:
        want = len(reqs) / args.rate * args.time_scale
        stretch(reqs, info, want / info["span"])
    return reqs, info


def main(argv):
    args = parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    m = machine()
    tmp = tempfile.mkdtemp(prefix="smg-multihost-")
    procs = Procs(tmp, log)
    res, info = {}, None
    t0 = time.monotonic()
    trap_signals()
    rc = 0
    try:
        reqs, info = workload(args)
        log(f"{info['n']} requests, oracle {100 * info['oracle']:.1f}%, "
            f"{info['span'] / args.time_scale:.0f} s wall a replay")
        bodies = Bodies(reqs)
        certs = None
        if any(parse_config(x)[0] == "tls" for x in args.names):
            d = os.path.join(tmp, "certs")
            os.makedirs(d)
            certs = make_certs(d)
        order = [x for x in RUN_ORDER if x in args.names] + \
            [x for x in args.names if x not in RUN_ORDER]
        for name in order:
            try:
                f = run_config(args, procs, info, reqs, bodies, name, certs)
            except NotAvailable as e:
                log(f"{name}: not available: {e}")
                res[name] = {"unavailable": str(e)[:160].replace("|", "/")}
                continue
            except (RuntimeError, OSError, ValueError,
                    http.client.HTTPException) as e:
                log(f"{name}: run failed: {e}")
                res[name] = {"unavailable": "run failed: " +
                             str(e)[:160].replace("|", "/")}
                continue
            res[name] = f
            log(f"{name}: hit {100 * f['hit']:.1f}%, busiest "
                f"{f['busiest']:.2f}, ttft p50/p99 {ms(f['p50'])}/"
                f"{ms(f['p99'])} ms, util {100 * f['util']:.0f}%, errors "
                f"{sum(f['errors'].values())}, fallback "
                f"{f['fallback']:.0f}, rtt {rtt_cell(f['rtt'])} us, host "
                f"busy {100 * f['host_busy']:.0f}%, wall {f['wall']:.0f} s")
    except Interrupted as e:
        log(f"interrupted ({e}); reporting what was measured")
        rc = 130
    finally:
        finish(procs, tmp, args.keep_tmp, log)
    text = report(args, m, info, res, time.monotonic() - t0,
                  [x for x in CONFIGS if x in args.names] +
                  [x for x in args.names if x not in CONFIGS])
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
