#!/usr/bin/python3
"""datapath.py: the data-path benchmark of smg-c, side by side with nginx,
HAProxy and a worker reached directly, in one run on one machine.

It starts two smg-simworkers (--time-scale 0: answers without delay), then
smg-c (round_robin over both), nginx and HAProxy (both round robin over the
same workers, keep-alive upstreams), and measures each with wrk:
  * peak: closed loop, --threads x --connections, requests/s and p50/p99;
  * half load: the same request rate for every target, half of smg-c's peak
    (HAProxy's when smg-c could not be measured), offered by wrk with a
    think time per connection and a connection count calibrated per target;
    p50/p99 there, and the latency each proxy adds over the direct worker;
for two workloads: a ~1 KB non-streaming POST /v1/completions, and a
streamed response of 64 chunks. It also runs bench-pingpong (Unix
socketpair round trip, 256 B) and reads smg-c's own
smg_broker_round_trip_seconds histogram before and after each smg-c run.

Prints a Markdown report (also written to --out). Runs with errors are
reported with their counts. Ports are picked free; every process started is
stopped on exit, Ctrl-C and failure included. Standard library only.

usage: /usr/bin/python3 tests/bench/datapath.py [--build-dir DIR] [--out F]
"""
import argparse
import http.client
import json
import math
import os
import shutil
import sys
import tempfile
import time

from benchlib import (Interrupted, Procs, add_build_dir, add_out, build_type,
                      counter_delta, finish, free_port, haproxy_conf,
                      histogram_delta, histogram_quantile, http_call, logger,
                      machine, md_table, nginx_conf, scrape, start_haproxy,
                      start_nginx, start_simworker, start_smg, trap_signals)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LUA = os.path.join(HERE, "datapath.lua")
MODEL = "sim-model"
TARGETS = ["direct", "smg-c", "nginx", "haproxy"]  # + --also-frontends
TARGET_TITLES = {"direct": "direct (1 worker)", "smg-c": "smg-c",
                 "nginx": "nginx", "haproxy": "HAProxy"}
WORKLOADS = ("completion", "stream")
WORKLOAD_TITLES = {
    "completion": "non-streaming POST /v1/completions, ~1 KB prompt, "
                  "max_tokens 8",
    "stream": "streamed POST /v1/completions, max_tokens 64 "
              "(64 SSE chunks + usage + [DONE])",
}
# Histogram buckets handed to smg-c so the decision round trip (tens of
# microseconds to milliseconds) is resolved; at most 24 bounds.
RTT_BUCKETS = ("2.5e-05 5e-05 7.5e-05 0.0001 0.000125 0.00015 0.0002 "
               "0.00025 0.0003 0.0004 0.0005 0.0006 0.0008 0.001 0.0015 "
               "0.002 0.003 0.004 0.006 0.008 0.012 0.02 0.05 1").split()
RTT_FAMILY = "smg_broker_round_trip_seconds"
FALLBACK_FAMILY = "smg_broker_fallback_decisions_total"
log = logger()


# ---------------------------------------------------------------- probes


def post(port, body, timeout=5.0):
    """One POST /v1/completions; (status, headers, body bytes)."""
    return http_call(port, "POST", "/v1/completions", body, timeout)


def probe(port, bodies, n=4):
    """Checks that a target answers both workloads correctly. Returns
    (None, workers seen) or (error text, workers seen)."""
    seen = []
    for _ in range(n):
        st, hdrs, data = post(port, bodies["completion"])
        if st != 200:
            return f"non-streaming: HTTP {st}: {data[:200]!r}", seen
        json.loads(data)
        seen.append(hdrs.get("x-sim-worker", "?"))
    st, hdrs, data = post(port, bodies["stream"])
    if st != 200:
        return f"streaming: HTTP {st}: {data[:200]!r}", seen
    events = [ln for ln in data.split(b"\n") if ln.startswith(b"data: ")]
    if not events or events[-1].strip() != b"data: [DONE]" or \
            len(events) < 66:
        return f"streaming: {len(events)} events, last " \
               f"{events[-1][:60] if events else b''!r}", seen
    return None, seen


def wait_ready(port, bodies, timeout, proc):
    deadline = time.monotonic() + timeout
    err = "not tried"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return f"exited with status {proc.returncode}", []
        try:
            err, seen = probe(port, bodies)
            if err is None:
                return None, seen
        except (OSError, http.client.HTTPException, ValueError) as e:
            err = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    return f"not ready after {timeout:.0f}s: {err}", []


def worker_requests(workers):
    """Requests each simworker has completed (GET /sim/stats), or None."""
    out = []
    for port in workers:
        try:
            out.append(int(json.loads(
                http_call(port, "GET", "/sim/stats")[2])["requests"]))
        except (OSError, http.client.HTTPException, ValueError, KeyError,
                TypeError):
            return None
    return out


# ---------------------------------------------------------------- wrk


def wrk(procs, args, url, body_file, conns, secs, delay_ms=None):
    """One wrk run; a dict of its figures, plus "rps", or {"failed": why}."""
    env = dict(os.environ, BENCH_BODY_FILE=body_file)
    env.pop("BENCH_DELAY_MS", None)
    if delay_ms:
        env["BENCH_DELAY_MS"] = str(delay_ms)
    threads = min(args.threads, conns)
    argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{secs}s", "--latency",
            "--timeout", "10s", "-s", LUA, url]
    rc, out, err = procs.run(argv, env, timeout=secs + 30)
    for ln in out.splitlines():
        if ln.startswith("BENCH_RESULT "):
            r = json.loads(ln[len("BENCH_RESULT "):])
            r["rps"] = r["requests"] * 1e6 / max(r["duration_us"], 1)
            r["conns"] = conns
            r["errors_total"] = sum(r["errors"].values())
            return r
    return {"failed": f"wrk exit {rc}: {(err or out).strip()[:200]}"}


def calibrate(procs, args, url, body_file, rate):
    """The connection count that offers about `rate` req/s when each
    connection waits args.think_ms after a response before its next
    request: a first guess, then short runs on this target scale it by
    offered/achieved. Returns (conns, None) or (None, failure text)."""
    d = args.think_ms
    conns = max(args.threads, math.ceil(rate * (d + 0.5) / 1000.0))
    conns = min(conns, args.max_conns)
    for _ in range(args.calibrations):
        r = wrk(procs, args, url, body_file, conns, args.calib_secs, d)
        if "failed" in r:
            return None, r["failed"]
        if r["rps"] <= 0:
            return None, "no request completed while calibrating"
        if abs(r["rps"] - rate) <= 0.05 * rate:
            break
        want = round(conns * rate / r["rps"])
        want = max(args.threads, min(args.max_conns, want))
        if want == conns:
            break
        conns = want
    return conns, None


# ---------------------------------------------------------------- report


def fmt_ms(us):
    return f"{us / 1000.0:.2f}"


def fmt_errors(r):
    if "failed" in r:
        return "run failed"
    e = {k: v for k, v in r["errors"].items() if v}
    if not e:
        return "0"
    return "**" + ", ".join(f"{k} {v}" for k, v in e.items()) + "**"


def fmt_split(r):
    sp = r.get("split")
    if not sp or sum(sp) <= 0:
        return "n/a"
    return "/".join(f"{100.0 * x / sum(sp):.0f}" for x in sp)


def off_note(r, rate):
    """Marks a half-load run whose achieved rate is off the offered one."""
    if not rate or r["rps"] <= 0:
        return ""
    dev = r["rps"] / rate[0] - 1
    return f" **{dev * 100:+.0f}%**" if abs(dev) > 0.1 else ""


def fmt_ratio(a, b):
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def fmt_us(sec):
    return "n/a" if sec is None else f"{sec * 1e6:.0f}"


def report(args, m, pp, res, rtt, skipped, rates, seen, died):
    L = []
    L.append("# smg-c data-path benchmark\n")
    L.append(f"- date: {m['date']}; commit {m['commit']}")
    L.append(f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['kernel']}; "
             f"load average (1 min) {m['load']:.2f} at start, "
             f"{os.getloadavg()[0]:.2f} at end")
    L.append(f"- build: `{args.build_dir}` ({args.build_type})")
    L.append(f"- tools: {m['wrk']}; {m['nginx']}; {m['haproxy']}")
    L.append(f"- command: `{' '.join(args.argv)}`")
    L.append(f"- workers: 2 smg-simworker --time-scale 0; every proxy "
             f"uses {args.cores} processes/threads (nginx "
             f"worker_processes, HAProxy nbthread), smg-c --frontends "
             f"{args.smg_frontends or 'at its default'}"
             f"{''.join(f', {k}' for k in args.also)}; "
             f"wrk -t{args.threads} on the same machine")
    L.append("- w1/w2 %: share of a run's requests each worker completed "
             "(workers' /sim/stats)")
    L.append(f"- peak: wrk -c{args.conns}, {args.peak_secs} s after a "
             f"{args.warm_secs} s warm-up. Half load: "
             f"{args.think_ms} ms think time per connection, connections "
             f"calibrated per target to the offered rate, "
             f"{args.half_secs} s measured")
    for t, why in skipped.items():
        L.append(f"- **{TARGET_TITLES[t]} not measured: {why}**")
    for name, rc in died.items():
        L.append(f"- **{name} exited during the run (status {rc}); see "
                 f"its log with --keep-tmp**")
    for t, s in seen.items():
        L.append(f"- {TARGET_TITLES[t]} answered from worker(s) "
                 f"{', '.join(s)} in its first requests")
    L.append("")

    for w in WORKLOADS:
        L.append(f"## {WORKLOAD_TITLES[w]}\n")
        rate = rates.get(w)
        rows = []
        for t in TARGETS:
            if t in skipped:
                rows.append([TARGET_TITLES[t], "not measured"] + [""] * 8)
                continue
            p = res[t][w]["peak"]
            h = res[t][w].get("half", {"failed": "not run"})
            row = [TARGET_TITLES[t]]
            if "failed" in p:
                row += ["failed", "", "", p["failed"], ""]
            else:
                row += [f"{p['rps']:.0f}", fmt_ms(p["p50_us"]),
                        fmt_ms(p["p99_us"]), fmt_errors(p), fmt_split(p)]
            if "failed" in h:
                row += ["failed", "", "", h["failed"]]
            else:
                row += [f"{h['rps']:.0f} ({h['conns']}){off_note(h, rate)}",
                        fmt_ms(h["p50_us"]), fmt_ms(h["p99_us"]),
                        fmt_errors(h)]
            rows.append(row)
        L += md_table(["target", "peak req/s", "p50 ms", "p99 ms", "errors",
                       "w1/w2 %", "half load req/s (conns)", "p50 ms",
                       "p99 ms", "errors"], "lrrrllrrrl", rows)
        if rate:
            L.append(f"\nHalf load offered: {rate[0]:.0f} req/s "
                     f"(half of {rate[1]}'s peak).\n")
        else:
            L.append("\nHalf load not run (no peak to halve).\n")

    L.append("## One connection, one request at a time\n")
    L.append("wrk -t1 -c1: latency without queueing or contention; "
             "\"added\" is the target's quantile minus direct's.\n")
    rows = []
    for w in WORKLOADS:
        d = res["direct"][w].get("single")
        for t in TARGETS:
            r = res[t][w].get("single")
            if t in skipped or r is None:
                continue
            if "failed" in r:
                rows.append([w, TARGET_TITLES[t], "failed"] + [""] * 4 +
                            [r["failed"]])
                continue
            ok = d is not None and "failed" not in d
            a50 = fmt_ms(r["p50_us"] - d["p50_us"]) if ok else "n/a"
            a99 = fmt_ms(r["p99_us"] - d["p99_us"]) if ok else "n/a"
            rows.append([w, TARGET_TITLES[t], f"{r['rps']:.0f}",
                         fmt_ms(r["p50_us"]), fmt_ms(r["p99_us"]), a50, a99,
                         fmt_errors(r)])
    L += md_table(["workload", "target", "req/s", "p50 ms", "p99 ms",
                   "added p50 ms", "added p99 ms", "errors"], "llrrrrrl",
                  rows)
    L.append("")

    L.append("## Ratios (smg-c / other, same run)\n")

    def get(t, w, phase, key):
        r = res.get(t, {}).get(w, {}).get(phase)
        if not r or "failed" in r:
            return None
        return r[key]

    rows = []
    for w in WORKLOADS:
        for phase, key, title in (("peak", "rps", "peak req/s"),
                                  ("peak", "p50_us", "p50 at peak"),
                                  ("peak", "p99_us", "p99 at peak"),
                                  ("half", "p50_us", "p50 at half load"),
                                  ("half", "p99_us", "p99 at half load")):
            s = get("smg-c", w, phase, key)
            rows.append([w, title] +
                        [fmt_ratio(s, get(o, w, phase, key))
                         for o in ("nginx", "haproxy", "direct")])
    L += md_table(["workload", "figure", "smg-c/nginx", "smg-c/HAProxy",
                   "smg-c/direct"], "llrrr", rows)
    L.append("")

    L.append("## Latency added over direct at half load (ms)\n")
    added, rows = {}, []
    for w in WORKLOADS:
        for key in ("p50_us", "p99_us"):
            d = get("direct", w, "half", key)
            cells = []
            for t in ("smg-c", "nginx", "haproxy"):
                v = get(t, w, "half", key)
                a = None if v is None or d is None else v - d
                added[(t, w, key)] = a
                cells.append("n/a" if a is None else fmt_ms(a))
            rows.append([w, key[:3]] + cells)
    L += md_table(["workload", "quantile", "smg-c", "nginx", "HAProxy"],
                  "llrrr", rows)
    L.append("")

    L.append("## Decision round trip (frontend to broker and back)\n")
    if pp.get("failed"):
        L.append(f"Unix socketpair ping-pong: **failed: {pp['failed']}**\n")
    else:
        L.append(f"Unix socketpair ping-pong, {pp['size']} B, "
                 f"{pp['count']} round trips: p50 {pp['p50_us']:.1f} µs, "
                 f"p99 {pp['p99_us']:.1f} µs, mean {pp['mean_us']:.1f} µs "
                 f"({pp['round_trips_per_s']:.0f}/s).\n")
    if rtt is None:
        L.append("smg-c not measured: no round-trip figures.\n")
    elif not rtt:
        L.append(f"**`{RTT_FAMILY}` is absent from smg-c's /metrics.**\n")
    else:
        L.append(f"From smg-c's `{RTT_FAMILY}` histogram (buckets "
                 f"{RTT_BUCKETS[0]} to {RTT_BUCKETS[-1]} s, quantiles "
                 f"interpolated inside a bucket), read before and after each "
                 f"smg-c run. One observation per broker message; a message "
                 f"carries every decision a frontend had ready in one loop "
                 f"turn.\n")
        rows = []
        for name, d in rtt:
            if d.get("hist") is None:
                rows.append([name, "metric absent"] + [""] * 6)
                continue
            h = d["hist"]
            p50, e50 = histogram_quantile(0.5, h["buckets"])
            p99, e99 = histogram_quantile(0.99, h["buckets"])
            mean = h["sum"] / h["count"] if h["count"] else None
            per = d["requests"] / h["count"] if h["count"] else None
            fb = d["fallback"]
            rows.append([
                name, f"{h['count']:.0f}",
                str(d["requests"]), "n/a" if per is None else f"{per:.1f}",
                ("" if e50 else "> ") + fmt_us(p50),
                ("" if e99 else "> ") + fmt_us(p99), fmt_us(mean),
                "0 (no series)" if fb is None else f"{fb:.0f}"])
            d["p99"] = p99 if e99 else None
        L += md_table(["smg-c run", "round trips", "requests",
                       "requests per round trip", "p50 µs", "p99 µs",
                       "mean µs", "fallback decisions"], "lrrrrrrr", rows)
        L.append("")
    L.append("## Targets of the data path\n")

    def verdict(ok):
        return "n/a" if ok is None else ("met" if ok else "**missed**")

    for w in WORKLOADS:
        s, h = get("smg-c", w, "peak", "rps"), get("haproxy", w, "peak", "rps")
        ok = None if s is None or h is None else s >= 0.8 * h
        L.append(f"- {w}: throughput >= 0.8x HAProxy: "
                 f"{fmt_ratio(s, h)} -> {verdict(ok)}")
        for key in ("p50_us", "p99_us"):
            a, b = added[("smg-c", w, key)], added[("haproxy", w, key)]
            if a is None or b is None:
                ok, txt = None, "n/a"
            else:
                limit = max(b, 0) * 1.5
                ok = a <= limit
                txt = (f"smg-c adds {fmt_ms(a)} ms, HAProxy {fmt_ms(b)} ms, "
                       f"limit {fmt_ms(limit)} ms")
            L.append(f"- {w}: added {key[:3]} at half load <= 1.5x "
                     f"HAProxy's: {txt} -> {verdict(ok)}")
    if rtt and not pp.get("failed"):
        for name, d in rtt:
            p99 = d.get("p99")
            ok = None if p99 is None else p99 * 1e6 <= 2 * pp["p99_us"]
            L.append(f"- decision round trip p99 <= 2x socketpair p99 "
                     f"({name}): {fmt_us(p99)} µs vs 2 x "
                     f"{pp['p99_us']:.1f} µs -> {verdict(ok)}")
    errs = [f"{TARGET_TITLES[t]} {w} {ph}"
            for t in TARGETS if t not in skipped for w in WORKLOADS
            for ph in ("peak", "single", "half")
            if res[t][w].get(ph) and ("failed" in res[t][w][ph] or
                                      res[t][w][ph]["errors_total"])]
    L.append("")
    L.append("Runs with errors or failures: " +
             (", ".join(errs) if errs else "none") + ".")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- main


def bodies_for(tmp, prompt_bytes):
    words = "the quick brown fox jumps over a lazy dog while sim " \
            "workers answer every request ".split()
    prompt, i = [], 0
    while len(" ".join(prompt)) < prompt_bytes:
        prompt.append(words[i % len(words)])
        i += 1
    text = " ".join(prompt)[:prompt_bytes]
    out = {}
    for w, extra in (("completion", {"max_tokens": 8}),
                     ("stream", {"max_tokens": 64, "stream": True})):
        body = json.dumps(dict({"model": MODEL, "prompt": text}, **extra))
        path = os.path.join(tmp, f"body-{w}.json")
        with open(path, "w") as f:
            f.write(body)
        out[w] = (path, body.encode())
    return out


def parse_args():
    ap = argparse.ArgumentParser(
        description="smg-c data-path benchmark against direct, nginx and "
                    "HAProxy (one run, one machine)")
    add_build_dir(ap, "Release build holding smg, smg-simworker and "
                      "bench-pingpong")
    add_out(ap)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                    help="processes/threads of each proxy (default: nproc)")
    ap.add_argument("--smg-frontends", type=int, default=None,
                    help="smg-c --frontends (default: smg's own default)")
    ap.add_argument("--also-frontends", default="",
                    help="comma-separated --frontends values: one more "
                         "smg-c target for each, measured right after the "
                         "main one (ratios and targets use the main one)")
    ap.add_argument("--threads", type=int, default=2, help="wrk threads")
    ap.add_argument("--conns", type=int, default=64,
                    help="wrk connections at peak")
    ap.add_argument("--peak-secs", type=int, default=10)
    ap.add_argument("--warm-secs", type=int, default=2)
    ap.add_argument("--half-secs", type=int, default=8)
    ap.add_argument("--single-secs", type=int, default=3,
                    help="duration of the one-connection run")
    ap.add_argument("--calib-secs", type=int, default=2)
    ap.add_argument("--calibrations", type=int, default=3,
                    help="calibration runs per half-load measurement")
    ap.add_argument("--think-ms", type=int, default=5,
                    help="think time per connection at half load")
    ap.add_argument("--max-conns", type=int, default=256,
                    help="most connections a half-load run may use")
    ap.add_argument("--prompt-bytes", type=int, default=1000)
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help="comma-separated subset of " + ",".join(TARGETS))
    ap.add_argument("--keep-tmp", action="store_true",
                    help="keep the temp dir (configs, logs) after the run")
    args = ap.parse_args()
    args.argv = ["/usr/bin/python3", os.path.relpath(__file__, ROOT)] + \
        sys.argv[1:]
    args.build_dir = os.path.abspath(args.build_dir)
    args.build_type = build_type(args.build_dir)
    args.targets = [t for t in args.targets.split(",") if t]
    args.also = [int(k) for k in args.also_frontends.split(",") if k]
    if args.also:
        TARGET_TITLES["smg-c"] = "smg-c --frontends " + (
            str(args.smg_frontends) if args.smg_frontends else "default")
    for i, k in enumerate(args.also):
        name = f"smg-c-f{k}"
        TARGETS.insert(2 + i, name)
        TARGET_TITLES[name] = f"smg-c --frontends {k}"
        if "smg-c" in args.targets:
            args.targets.append(name)
    for t in args.targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t}")
    return args


def start_targets(procs, args, tmp, workers, bodies, skipped, seen):
    """Starts smg-c, nginx and HAProxy; returns {target: (port, proc)}."""
    b = args.build_dir
    urls = [f"http://127.0.0.1:{w}" for w in workers]
    ports = {"direct": (workers[0], None)}
    if "smg-c" in args.targets:
        p, port, prom = start_smg(procs, os.path.join(b, "smg"), "smg", [
            "--policy", "round_robin", *(
                ["--frontends", str(args.smg_frontends)]
                if args.smg_frontends else []), "--worker-urls", *urls,
            "--prometheus-duration-buckets", *RTT_BUCKETS,
            "--log-level", "warn"])
        ports["smg-c"] = (port, p)
        args.prom_port = prom
        for k in args.also:
            p, port, _ = start_smg(procs, os.path.join(b, "smg"),
                                   f"smg-f{k}", [
                "--policy", "round_robin", "--frontends", str(k),
                "--worker-urls", *urls, "--log-level", "warn"])
            ports[f"smg-c-f{k}"] = (port, p)
    if "nginx" in args.targets:
        port = free_port()
        p = start_nginx(procs, nginx_conf(tmp, port, workers, args.cores,
                                          "datapath.py"))
        ports["nginx"] = (port, p)
    if "haproxy" in args.targets:
        port = free_port()
        servers = [(f"w{i + 1}", w) for i, w in enumerate(workers)]
        p = start_haproxy(procs, haproxy_conf(
            port, servers, args.cores, "datapath.py",
            defaults_extra=("http-reuse always",)))
        ports["haproxy"] = (port, p)
    for t in TARGETS:
        if t not in args.targets:
            continue
        if t not in ports:
            skipped[t] = "not started"
            continue
        port, p = ports[t]
        err, s = wait_ready(port, {w: bodies[w][1] for w in WORKLOADS},
                            30.0 if t.startswith("smg-c") else 10.0, p)
        if err:
            log(f"{t}: {err} (see {tmp}/*.log)")
            skipped[t] = err
        else:
            seen[t] = sorted(set(s))
            log(f"{t}: ready on port {port}, workers {seen[t]}")
    return {t: v[0] for t, v in ports.items() if t not in skipped}


def main():
    args = parse_args()
    trap_signals()
    for tool in ("wrk", "nginx", "haproxy"):
        if shutil.which(tool) is None:
            sys.exit(f"datapath.py: {tool} not found in PATH")
    for name in ("smg", "smg-simworker", "bench-pingpong"):
        if not os.path.exists(os.path.join(args.build_dir, name)):
            sys.exit(f"datapath.py: {args.build_dir}/{name} not built")
    if args.build_type != "Release":
        log(f"warning: {args.build_dir} is a {args.build_type} build; "
            f"figures of a sanitized build say nothing about speed")
    m = machine(("wrk", "nginx", "haproxy"))
    tmp = tempfile.mkdtemp(prefix="smg-bench-")
    procs = Procs(tmp, log)
    res = {t: {w: {} for w in WORKLOADS} for t in TARGETS}
    skipped = {t: "not selected" for t in TARGETS if t not in args.targets}
    seen, rates, rtt, died = {}, {}, None, {}
    try:
        log(f"temp dir {tmp}")
        bodies = bodies_for(tmp, args.prompt_bytes)
        workers = []
        for i in (1, 2):
            workers.append(start_simworker(
                procs, os.path.join(args.build_dir, "smg-simworker"),
                f"worker{i}", ["--time-scale", "0", "--model", MODEL,
                               "--worker-id", f"w{i}",
                               "--log-level", "warn"])[1])
        log(f"workers on ports {workers}")
        ports = start_targets(procs, args, tmp, workers, bodies, skipped,
                              seen)

        log("socketpair ping-pong")
        rc, out, err = procs.run(
            [os.path.join(args.build_dir, "bench-pingpong"), "--size", "256",
             "--count", "20000"], None, 120)
        try:
            pp = json.loads(out.strip().splitlines()[-1]) if rc == 0 else \
                {"failed": f"exit {rc}: {err.strip()[:200]}"}
        except (ValueError, IndexError):
            pp = {"failed": f"unreadable output {out[:200]!r}"}

        rtt = [] if "smg-c" in ports else None

        def measured(t, w, phase, fn):
            """Runs fn() -> wrk result, around smg-c metric snapshots."""
            before = scrape(args.prom_port) if t == "smg-c" else None
            wb = worker_requests(workers)
            r = fn()
            wa = worker_requests(workers)
            if "failed" not in r and wb is not None and wa is not None:
                r["split"] = [a - b for a, b in zip(wa, wb)]
            res[t][w][phase] = r
            if t != "smg-c":
                return
            after = scrape(args.prom_port)
            entry = {"hist": None, "fallback": None, "requests": 0}
            if before is not None and after is not None:
                entry["hist"] = histogram_delta(before, after, RTT_FAMILY)
                entry["fallback"] = counter_delta(before, after,
                                                  FALLBACK_FAMILY)
            if "failed" not in r:
                entry["requests"] = r["requests"]
            rtt.append((f"{w} {phase}", entry))

        for w in WORKLOADS:
            for t in TARGETS:
                if t not in ports:
                    continue
                url = f"http://127.0.0.1:{ports[t]}/v1/completions"
                log(f"{t} {w}: warm-up {args.warm_secs}s, peak "
                    f"{args.peak_secs}s")
                wrk(procs, args, url, bodies[w][0], args.conns,
                    args.warm_secs)
                measured(t, w, "peak", lambda: wrk(
                    procs, args, url, bodies[w][0], args.conns,
                    args.peak_secs))
                r = res[t][w]["peak"]
                log(f"{t} {w}: " + (r["failed"] if "failed" in r else
                                    f"{r['rps']:.0f} req/s, "
                                    f"errors {r['errors_total']}"))
                log(f"{t} {w}: one connection, {args.single_secs}s")
                measured(t, w, "single", lambda: wrk(
                    procs, args, url, bodies[w][0], 1, args.single_secs))
        for w in WORKLOADS:
            base = next((t for t in ("smg-c", "haproxy", "nginx")
                         if t in ports and "failed" not in res[t][w]["peak"]
                         and res[t][w]["peak"]["rps"] > 0), None)
            if base is None:
                continue
            rate = res[base][w]["peak"]["rps"] / 2
            rates[w] = (rate, TARGET_TITLES[base])
            for t in TARGETS:
                if t not in ports:
                    continue
                url = f"http://127.0.0.1:{ports[t]}/v1/completions"
                log(f"{t} {w}: half load, {rate:.0f} req/s offered")
                conns, why = calibrate(procs, args, url, bodies[w][0], rate)
                if conns is None:
                    res[t][w]["half"] = {"failed": why}
                    continue
                for attempt in range(2):
                    measured(t, w, "half", lambda: wrk(
                        procs, args, url, bodies[w][0], conns,
                        args.half_secs, args.think_ms))
                    r = res[t][w]["half"]
                    if "failed" in r or r["rps"] <= 0 or \
                            abs(r["rps"] / rate - 1) <= 0.1:
                        break
                    want = round(conns * rate / r["rps"])
                    want = max(args.threads, min(args.max_conns, want))
                    if want == conns or attempt == 1:
                        break
                    log(f"{t} {w}: {r['rps']:.0f} req/s with {conns} "
                        f"conns, measuring again with {want}")
                    conns = want
                    if t == "smg-c":
                        rtt.pop()
                r = res[t][w]["half"]
                log(f"{t} {w}: " + (r["failed"] if "failed" in r else
                                    f"{r['rps']:.0f} req/s with "
                                    f"{r['conns']} conns"))
        for p in procs.procs:
            if p.poll() is not None:
                died[p.bench_name] = p.returncode
        if rtt is not None and all(e["hist"] is None for _, e in rtt):
            rtt = []
        text = report(args, m, pp, res, rtt, skipped, rates, seen, died)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
            log(f"report written to {args.out}")
    except (KeyboardInterrupt, Interrupted) as e:
        log(f"interrupted ({e or 'Ctrl-C'}); stopping every process")
        return 130
    finally:
        finish(procs, tmp, args.keep_tmp, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
