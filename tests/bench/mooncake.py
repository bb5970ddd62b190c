#!/usr/bin/python3
"""mooncake.py: routing quality of smg-c's policies on the Mooncake trace,
side by side with nginx and HAProxy round robin, in one run on one machine.

It replays the Mooncake synthetic trace (../shared/data, 3,993 requests,
prompts given as 512-token block ids) as streamed POST /v1/completions
against four smg-simworkers whose KV capacities together hold the replayed
prompts' distinct blocks once (a quarter each), through each target:
smg-c with cache_aware, prefix_hash, consistent_hashing (no key),
least_load and round_robin, then nginx and HAProxy round robin. The
workers are restarted between targets (fresh caches, fresh stats).

Per target: cache hit rate (sum of cached over prompt tokens from the
workers' GET /sim/stats), TTFT p50/p99 measured by the client at the first
SSE data event, end-to-end at [DONE], throughput, the busiest worker's
share of requests over the mean, prefill utilisation, error rate; and once
for the run the oracle bound: the share of prompt tokens in leading blocks
already seen earlier in the replayed trace.

A policy the broker refuses is reported as not available; the run goes on.
Prints a Markdown report (also written to --out). Every process started is
stopped on exit, Ctrl-C and failure included. Standard library only.

usage: /usr/bin/python3 tests/bench/mooncake.py [--build-dir DIR] [--out F]
"""
import argparse
import asyncio
import http.client
import math
import os
import shlex
import resource
import shutil
import sys
import tempfile
import time

from benchlib import (BLOCK_TOKENS, Bodies, Fleet, Interrupted, NotAvailable,
                      Procs, add_build_dir, add_out, build_type, finish,
                      free_port, haproxy_conf, host_cpu, load_trace, logger,
                      machine, md_table, nearest_rank, nginx_conf,
                      oracle_bound, probe, refusal, replay, rusage_secs,
                      start_haproxy, start_nginx, start_smg_target,
                      trap_signals)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_TRACE = os.path.join(os.path.dirname(ROOT), "shared", "data",
                             "mooncake-synthetic-trace.jsonl")
PAGE_SIZE = 16
WORKERS = 4
SMG_POLICIES = ("cache_aware", "prefix_hash", "consistent_hashing",
                "least_load", "round_robin")
TARGETS = SMG_POLICIES + ("nginx", "haproxy")
TITLES = {p: f"smg-c {p}" for p in SMG_POLICIES}
TITLES.update({"nginx": "nginx round robin",
               "haproxy": "HAProxy roundrobin"})
log = logger()
quantile = nearest_rank


# ---------------------------------------------------------------- targets


def start_smg(procs, args, policy, fleet):
    return start_smg_target(
        procs, args.smg, f"smg-{policy}",
        ["--policy", policy, "--frontends", str(args.cores)] +
        shlex.split(args.smg_args) + ["--worker-urls"] + fleet.urls(),
        WORKERS, args.ready_timeout)


def start_proxy(procs, args, kind, fleet):
    port = free_port()
    if kind == "nginx":
        p = start_nginx(procs, nginx_conf(
            procs.tmp, port, fleet.ports, args.cores, "mooncake.py",
            http_extra=("client_max_body_size 0",
                        "client_body_buffer_size 1m"),
            location_extra=("proxy_read_timeout 600s",
                            "proxy_send_timeout 600s")))
    else:
        servers = [(f"w{i + 1}", w) for i, w in enumerate(fleet.ports)]
        p = start_haproxy(procs, haproxy_conf(
            port, servers, args.cores, "mooncake.py", timeout="600s",
            defaults_extra=("http-reuse always", "option http-no-delay")))
    deadline = time.monotonic() + args.ready_timeout
    err = "not tried"
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise NotAvailable(f"{kind} exited with status {p.returncode}")
        try:
            err = probe(port)
            if err is None:
                return p, port
        except (OSError, http.client.HTTPException) as e:
            err = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise NotAvailable(f"not ready after {args.ready_timeout:.0f}s: {err}")


# ---------------------------------------------------------------- client


# ---------------------------------------------------------------- figures


def figures(args, reqs, results, wall, stats, samples):
    ok = [r for r in results if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    counts = [s["requests"] for s in stats]
    mean = sum(counts) / len(counts)
    rate = args.prefill_tps * args.time_scale
    util = [(s["prompt_tokens"] - s["cached_tokens"]) / (rate * wall)
            for s in stats]
    errors = {}
    for r in results:
        if r.error is not None:
            key = r.error.split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    waiting = [sum(row) / len(row) for row in samples]
    return {
        "n": len(results),
        "ok": len(ok),
        "hit": cached / prompt if prompt else 0.0,
        "ttft_p50": quantile(ttft, 0.5) if ttft else None,
        "ttft_p99": quantile(ttft, 0.99) if ttft else None,
        "e2e_p50": quantile([r.e2e for r in ok], 0.5) if ok else None,
        "rps": len(ok) / wall if wall > 0 else 0.0,
        "tps": sum(reqs[r.idx]["input_length"] for r in ok) / wall
        if wall > 0 else 0.0,
        "busiest": max(counts) / mean if mean else None,
        "counts": counts,
        "util_mean": sum(util) / len(util),
        "util_max": max(util),
        "waiting_mean": sum(waiting) / len(waiting) if waiting else None,
        "waiting_max": max(max(row) for row in samples) if samples else None,
        "lag_p99": quantile([r.lag for r in results], 0.99),
        "error_rate": 1 - len(ok) / len(results),
        "errors": errors,
        "wall": wall,
    }


def run_target(args, procs, target, reqs, bodies):
    """Starts a fresh fleet and the target, replays; figures or raises
    NotAvailable."""
    children0 = rusage_secs(resource.RUSAGE_CHILDREN)
    fleet = Fleet(procs, args.simworker, target, [[
        "--page-size", str(PAGE_SIZE),
        "--kv-capacity", str(args.kv_capacity),
        "--context-length", str(args.context_length),
        "--prefill-tps", str(args.prefill_tps),
        "--decode-base-ms", str(args.decode_base_ms),
        "--decode-per-req-ms", str(args.decode_per_req_ms),
        "--max-running", str(args.max_running),
        "--time-scale", str(args.time_scale)]] * WORKERS)
    proc = None
    try:
        if target in SMG_POLICIES:
            proc, port = start_smg(procs, args, target, fleet)
        else:
            proc, port = start_proxy(procs, args, target, fleet)
        fleet.reset()
        log(f"{TITLES[target]}: replaying {len(reqs)} requests")
        host0, self0 = host_cpu(), rusage_secs(resource.RUSAGE_SELF)
        results, wall, samples = asyncio.run(
            replay(port, reqs, bodies, args.speedup, args.read_batch,
                   args.request_timeout, fleet.ports))
        host1, self1 = host_cpu(), rusage_secs(resource.RUSAGE_SELF)
        stats = fleet.stats()
        f = figures(args, reqs, results, wall, stats, samples)
        f["dead"] = fleet.dead() + \
            ([proc.bench_name] if proc.poll() is not None else [])
        if target in SMG_POLICIES:
            f["refusal"] = refusal(os.path.join(procs.tmp,
                                                proc.bench_name + ".log"))
    finally:
        if proc is not None:
            procs.stop(proc)
        fleet.stop()
    # Children are reaped by now: their CPU includes start-up and probes.
    f["cpu_client"] = self1 - self0
    f["cpu_children"] = rusage_secs(resource.RUSAGE_CHILDREN) - children0
    f["host_busy"] = (host1[0] - host0[0]) / max(host1[1] - host0[1], 1e-9)
    log(f"{TITLES[target]}: hit {f['hit']:.3f}, ttft p50 "
        f"{fmt_ms(f['ttft_p50'])} ms, busiest {fmt_x(f['busiest'])}, "
        f"errors {f['n'] - f['ok']}, host busy {100 * f['host_busy']:.0f}%")
    return f


# ---------------------------------------------------------------- report


def fmt_ms(sec):
    return "n/a" if sec is None else f"{sec * 1000:.0f}"


def fmt_x(x):
    return "n/a" if x is None else f"{x:.2f}"


def fmt_pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def report(args, m, info, res):
    L = ["# smg-c routing quality on the Mooncake trace\n"]
    L.append(f"- date: {m['date']}; commit {m['commit']}")
    L.append(f"- machine: {m['nproc']} CPUs ({m['cpu']}), "
             f"{m['mem']:.0f} GiB, {m['kernel']}; Python {m['python']}")
    L.append(f"- build: `{args.build_dir}` ({args.build_type}); "
             f"{m['nginx']}; {m['haproxy']}")
    L.append(f"- command: `{' '.join(args.argv)}`")
    L.append(f"- trace: `{os.path.relpath(args.trace, ROOT)}`, first "
             f"{info['n']} requests ({info['span']:.0f} s of trace time), "
             f"replayed {args.speedup:.2f}x faster: {info['replay']:.0f} s, "
             f"{info['n'] / info['replay']:.1f} req/s offered; "
             f"{info['prompt_tokens'] / 1e6:.1f} M prompt tokens, "
             f"{info['distinct']} distinct blocks")
    L.append("- prompts: each 512-token block id expands to 2,048 hex "
             "characters of BLAKE2b(id, counter); blocks concatenated, cut "
             "to input_length x 4 characters; streamed POST "
             "/v1/completions, max_tokens = output_length, one connection "
             "per request, sent at its scheduled time")
    L.append(f"- fleet: {WORKERS} smg-simworker, fresh for every target: "
             f"--kv-capacity {args.kv_capacity} tokens each (distinct "
             f"blocks x 512 / {WORKERS}, page multiple), --prefill-tps "
             f"{args.prefill_tps:g}, --time-scale {args.time_scale:g}, "
             f"--decode-base-ms {args.decode_base_ms:g}, "
             f"--decode-per-req-ms {args.decode_per_req_ms:g}, "
             f"--max-running {args.max_running}, --page-size {PAGE_SIZE}")
    extra = f" {args.smg_args}" if args.smg_args else ""
    L.append(f"- smg-c: `smg --policy P --frontends {args.cores}{extra} "
             f"--worker-urls w1..w4`, every other flag at its default; "
             f"nginx (worker_processes {args.cores}) and HAProxy (nbthread "
             f"{args.cores}, option http-no-delay) round robin, keep-alive "
             f"upstreams, responses streamed unbuffered")
    L.append(f"- **oracle bound: {fmt_pct(info['oracle'])}** of prompt "
             f"tokens are in leading blocks already seen earlier in the "
             f"replayed requests")
    L.append("")
    rows = []
    for t in args.target_list:
        r = res.get(t)
        if r is None or "unavailable" in r:
            why = "not run (interrupted)" if r is None else \
                r["unavailable"]
            rows.append([TITLES[t], why] + [""] * 10)
            continue
        of = r["hit"] / info["oracle"] if info["oracle"] else None
        err = f"{fmt_pct(r['error_rate'])}"
        if r["errors"]:
            err = "**" + err + " (" + ", ".join(
                f"{k} {v}" for k, v in r["errors"].items()) + ")**"
        wait = "n/a" if r["waiting_mean"] is None else \
            f"{r['waiting_mean']:.1f}/{r['waiting_max']}"
        rows.append([
            TITLES[t], fmt_pct(r["hit"]),
            "n/a" if of is None else f"{100 * of:.0f}%",
            fmt_ms(r["ttft_p50"]), fmt_ms(r["ttft_p99"]),
            fmt_ms(r["e2e_p50"]), f"{r['rps']:.1f}",
            f"{r['tps'] / 1000:.0f}k",
            f"{fmt_x(r['busiest'])} "
            f"({'/'.join(str(c) for c in r['counts'])})",
            f"{100 * r['util_mean']:.0f}%/{100 * r['util_max']:.0f}%",
            wait, err])
    L += md_table(["target", "hit rate", "of oracle", "TTFT p50 ms",
                   "TTFT p99 ms", "E2E p50 ms", "req/s", "prompt tok/s",
                   "busiest/mean", "prefill util mean/max",
                   "waiting mean/max", "errors"], "lrrrrrrrrlll", rows)
    L.append("")
    L += md_table(["target", "wall s", "client CPU s",
                   "workers + target CPU s", "host CPU busy"], "lrrrr",
                  [[TITLES[t], f"{r['wall']:.0f}", f"{r['cpu_client']:.0f}",
                    f"{r['cpu_children']:.0f}",
                    f"{100 * r['host_busy']:.0f}%"]
                   for t, r in ((t, res.get(t)) for t in args.target_list)
                   if r is not None and "unavailable" not in r])
    L.append("")
    L.append("- hit rate: sum of cached_tokens / sum of prompt_tokens over "
             "the four workers' GET /sim/stats; of oracle: hit rate / "
             "oracle bound")
    L.append(f"- TTFT: from a request's scheduled send time to its first "
             f"SSE data event, at the client; E2E: to `data: [DONE]` (read "
             f"every {1000 * args.read_batch:.0f} ms after the first token, "
             f"so to within that); successful requests only")
    L.append("- req/s, prompt tok/s: successful requests (their prompt "
             "tokens) / wall time from the first scheduled send to the "
             "last [DONE]")
    L.append("- busiest/mean: the most requests any worker completed over "
             "the mean per worker (per-worker counts in brackets)")
    L.append("- prefill util: a worker's uncached prompt tokens / (its "
             "prefill rate x wall time), mean and busiest worker; waiting: "
             "requests queued per worker (GET /v1/loads every 0.5 s), mean "
             "of the fleet average and the highest single sample")
    L.append(f"- CPU: this client's and the started processes' CPU "
             f"seconds per target; host CPU busy: share of all "
             f"{m['nproc']} CPUs busy during the replay, anything else "
             f"running on the host included (TTFT is only comparable "
             f"between rows when that stays well below 100%)")
    L.append("- errors: non-2xx statuses, transport errors, streams "
             "without [DONE], requests still open after --request-timeout")
    lags = [r["lag_p99"] for r in res.values() if "lag_p99" in r]
    if lags:
        L.append(f"- client lateness (send after its scheduled time), worst "
                 f"p99 over targets: {1000 * max(lags):.1f} ms")
    for t, r in res.items():
        if r.get("dead"):
            L.append(f"- **{TITLES[t]}: {', '.join(r['dead'])} exited "
                     f"during the run**")
        if r.get("refusal"):
            L.append(f"- **{TITLES[t]}: broker log: {r['refusal']}**")
    L.append("")
    L.append(checks(info, res))
    return "\n".join(L) + "\n"


def checks(info, res):
    L = ["## Targets\n"]
    ca, rr = res.get("cache_aware"), res.get("round_robin")
    if not ca or "unavailable" in ca:
        L.append("- cache_aware not measured: no target checked")
        return "\n".join(L) + "\n"
    ratio = ca["hit"] / info["oracle"] if info["oracle"] else 0.0
    L.append(f"- cache_aware hit rate >= 90% of the oracle bound: "
             f"{100 * ratio:.0f}% -> "
             f"{'met' if ratio >= 0.9 else '**not met**'}")
    busy = ca["busiest"]
    L.append(f"- busiest worker <= 1.3x the mean: {fmt_x(busy)}x -> "
             f"{'met' if busy is not None and busy <= 1.3 else '**not met**'}")
    if rr and "unavailable" not in rr and ca["ttft_p50"] and \
            rr["ttft_p50"]:
        x = rr["ttft_p50"] / ca["ttft_p50"]
        L.append(f"- TTFT p50 >= 2x better than round_robin: {x:.2f}x -> "
                 f"{'met' if x >= 2 else '**not met**'}")
    else:
        L.append("- TTFT p50 vs round_robin: round_robin not measured")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- main


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Routing quality on the Mooncake trace: smg-c "
                    "policies, nginx and HAProxy over four simworkers.")
    add_build_dir(ap, "holds smg and smg-simworker")
    ap.add_argument("--trace", default=DEFAULT_TRACE)
    add_out(ap)
    ap.add_argument("--requests", type=int, default=0,
                    help="replay the first N requests (default: all)")
    ap.add_argument("--replay-secs", type=float, default=75.0,
                    help="wall time the replayed requests are spread over "
                         "(compresses the trace's timestamps)")
    ap.add_argument("--prefill-tps", type=float, default=400000,
                    help="simworker prefill tokens/s (model time)")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="simworker --time-scale")
    ap.add_argument("--decode-base-ms", type=float, default=5.0,
                    help="simworker decode step time (model time)")
    ap.add_argument("--decode-per-req-ms", type=float, default=0.02,
                    help="simworker decode step time per running request")
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                    help="smg-c frontends, nginx workers, HAProxy threads")
    ap.add_argument("--smg-args", default="",
                    help="extra smg flags for every smg-c target, e.g. "
                         "--smg-args=\"--balance-abs-threshold 8\"")
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help=f"comma-separated subset of {','.join(TARGETS)}")
    ap.add_argument("--request-timeout", type=float, default=60.0,
                    help="a request still open this long is an error")
    ap.add_argument("--read-batch", type=float, default=0.05,
                    help="after a response's first token, read its socket "
                         "every this many seconds (0: on every event)")
    ap.add_argument("--ready-timeout", type=float, default=20.0)
    ap.add_argument("--keep-tmp", action="store_true",
                    help="keep the temp dir (configs, every process's log)")
    args = ap.parse_args(argv)
    args.argv = ["/usr/bin/python3",
                 os.path.relpath(os.path.abspath(__file__), os.getcwd())] + \
        argv
    args.target_list = [t.strip() for t in args.targets.split(",")
                        if t.strip()]
    for t in args.target_list:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r}")
    if args.replay_secs <= 0 or args.prefill_tps <= 0 or \
            args.time_scale <= 0 or args.request_timeout <= 0:
        ap.error("--replay-secs, --prefill-tps, --time-scale and "
                 "--request-timeout must be > 0")
    args.build_dir = os.path.abspath(args.build_dir)
    args.build_type = build_type(args.build_dir)
    args.smg = os.path.join(args.build_dir, "smg")
    args.simworker = os.path.join(args.build_dir, "smg-simworker")
    for b in (args.smg, args.simworker):
        if not os.access(b, os.X_OK):
            ap.error(f"{b} not built")
    for tool in ("nginx", "haproxy"):
        if tool in args.target_list and shutil.which(
                tool, path=os.environ.get("PATH", "") + ":/usr/sbin") is None:
            ap.error(f"{tool} not in PATH (drop it from --targets)")
    return args


def main(argv):
    args = parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    reqs = load_trace(args.trace, args.requests)
    distinct = {b for r in reqs for b in r["hash_ids"]}
    hit, total = oracle_bound(reqs)
    span = reqs[-1]["timestamp"] / 1000.0
    args.speedup = span / args.replay_secs if span > 0 else 1.0
    quarter = math.ceil(len(distinct) * BLOCK_TOKENS / WORKERS)
    args.kv_capacity = math.ceil(quarter / PAGE_SIZE) * PAGE_SIZE
    longest = max(r["input_length"] + max(1, r["output_length"])
                  for r in reqs)
    args.context_length = max(32768, longest)
    if longest > args.kv_capacity:
        sys.exit(f"the longest request ({longest} tokens) does not fit "
                 f"a worker's KV capacity ({args.kv_capacity}); replay "
                 f"more requests")
    info = {"n": len(reqs), "span": span, "replay": span / args.speedup,
            "prompt_tokens": total, "distinct": len(distinct),
            "oracle": hit / total if total else 0.0}
    log(f"{len(reqs)} requests, {len(distinct)} distinct blocks, oracle "
        f"{100 * info['oracle']:.1f}%, replay {info['replay']:.0f} s "
        f"({args.speedup:.1f}x), kv capacity {args.kv_capacity} per worker")
    bodies = Bodies(reqs)
    m = machine(("nginx", "haproxy"))
    tmp = tempfile.mkdtemp(prefix="smg-mooncake-")
    procs = Procs(tmp, log)
    res = {}
    trap_signals()
    try:
        for t in args.target_list:
            try:
                res[t] = run_target(args, procs, t, reqs, bodies)
            except NotAvailable as e:
                log(f"{TITLES[t]}: not available: {e}")
                res[t] = {"unavailable": "not available: " +
                          str(e)[:160].replace("|", "/")}
            except (RuntimeError, OSError, ValueError,
                    http.client.HTTPException) as e:
                log(f"{TITLES[t]}: run failed: {e}")
                res[t] = {"unavailable": "run failed: " +
                          str(e)[:160].replace("|", "/")}
    except Interrupted as e:
        log(f"interrupted ({e}); reporting what was measured")
    finally:
        finish(procs, tmp, args.keep_tmp, log)
    text = report(args, m, info, res)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
