#!/usr/bin/python3
"""routing.py: does a routing policy make multi-turn traffic faster than
round robin? Every smg-c policy, one run, over four simulated engines.

Three workloads, each as Mooncake-format requests (prompts as 512-token
block ids, see benchlib.load_trace):

  mooncake  the synthetic Mooncake trace (conversation turns, shared
            prefixes), its first N requests;
  gsp       in the style of SGLang's generated-shared-prefix benchmark:
            G groups of a long shared system prompt, Q questions each,
            shuffled, Poisson arrivals;
  chat      multi-round chat: each turn's prompt is the previous turn's
            prompt plus the answer and a new user message (6k-60k tokens,
            growing), a few system prompts shared between conversations;
            a turn is sent once the previous one has ended (a user waits).

Engines: smg-simworkers configured like SGLang engines (16-token pages,
LRU, a prefill rate of --prefill-tps tokens/s of model time), run
--time-scale times faster than real time; each holds a quarter of the
workload's distinct blocks, so the fleet holds the working set once.
Arrivals are scaled so that round robin would run the fleet at
--target-util prefill utilisation: the round robin's uncached prefill
work is predicted by simulating its assignment over per-worker LRU caches
of that size, and the measured utilisation is reported. smg gets
--load-monitor-interval = --real-interval / --time-scale (the same time
scale), and cache_aware runs once more with the default flags (10 s
interval, unscaled).

Per workload and policy, same run: hit rate vs the oracle (share of prompt
tokens in blocks already seen earlier), busiest/mean requests, TTFT
p50/p90/p99 (model time) and their ratios to round robin's; then the
conversation workload again over a fleet where one worker prefills at half
the rate, with that worker's share of requests over a full-speed worker's
and its TTFT p50 over the others'.

Standard library only. Every process started is stopped on exit, Ctrl-C
and failure. usage: /usr/bin/python3 tests/bench/routing.py [--quick]
[--out F] (--help lists the sizes)
"""
import argparse
import asyncio
import collections
import http.client
import itertools
import math
import os
import random
import resource
import sys
import tempfile
import time

from benchlib import (BLOCK_TOKENS, Bodies, Fleet, Interrupted, NotAvailable,
                      Procs, add_build_dir, add_out, block_lengths, build_type,
                      finish, host_cpu, load_trace, logger, machine, md_table,
                      nearest_rank, oracle_bound, replay, rusage_secs,
                      start_smg_target, trap_signals)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_TRACE = os.path.join(os.path.dirname(ROOT), "shared", "data",
                             "mooncake-synthetic-trace.jsonl")
PAGE_SIZE = 16
WORKERS = 4
WORKLOADS = ("mooncake", "gsp", "chat")
# A variant is a policy with a flag set; "@default" runs without the
# scaled load-monitor interval.
VARIANTS = ("cache_aware", "cache_aware@default", "least_load",
            "power_of_two", "round_robin", "prefix_hash",
            "consistent_hashing")
FULL_VARIANTS = ("cache_aware", "cache_aware@default", "least_load",
                 "power_of_two", "round_robin", "prefix_hash")
QUICK_VARIANTS = ("cache_aware", "cache_aware@default", "least_load",
                  "power_of_two", "round_robin")
UNEQUAL_VARIANTS = ("cache_aware", "least_load", "power_of_two",
                    "round_robin")
QUICK_UNEQUAL_VARIANTS = ("cache_aware", "least_load", "round_robin")
BASELINE = "round_robin"
# Round robin's measured utilisation further than this from --target-util
# (the 70-90 % band around 80 %) rescales the workload's time and runs it
# again (at most twice).
UTIL_SLACK = 0.1
RUN_SEQ = itertools.count(1)
log = logger()
quantile = nearest_rank


# ---------------------------------------------------------------- workloads


class Ids:
    """Block ids, fresh for each use (the same id is the same text)."""

    def __init__(self, start):
        self.next = start

    def take(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def blocks_for(tokens):
    return max(1, math.ceil(tokens / BLOCK_TOKENS))


def workload_mooncake(args, rng):
    """About --mooncake-requests requests of the trace, taken as whole
    prefix trees: requests are grouped by their first block (a
    conversation, or everything behind one shared system prompt), groups
    are drawn at random until the count is reached, and every request of a
    drawn group whose prompt fits --max-prompt is kept, at its trace
    time. So turns keep their predecessors and the trace's mix of
    one-off and multi-turn requests stays."""
    trace = load_trace(args.trace, 0)
    groups = collections.defaultdict(list)
    for r in trace:
        groups[r["hash_ids"][0]].append(r)
    roots = sorted(groups)
    rng.shuffle(roots)
    picked, n = set(), 0
    for root in roots:
        if n >= args.mooncake_requests:
            break
        picked.add(root)
        n += len(groups[root])
    reqs = [r for r in trace if r["hash_ids"][0] in picked and
            r["input_length"] <= args.max_prompt]
    t0 = reqs[0]["timestamp"]
    return [{"timestamp": r["timestamp"] - t0,
             "input_length": r["input_length"],
             "output_length": r["output_length"],
             "hash_ids": r["hash_ids"]} for r in reqs]


def workload_gsp(args, rng):
    """G groups x Q questions: each prompt is its group's system prompt
    (--gsp-system-tokens, whole blocks) then a question of its own
    (uniform in --gsp-question-tokens), shuffled, Poisson arrivals (mean
    gap 1 s before scaling)."""
    ids = Ids(10_000_000)
    sys_blocks = blocks_for(args.gsp_system_tokens)
    lo, hi = args.gsp_question_tokens
    reqs = []
    for _ in range(args.gsp_groups):
        head = ids.take(sys_blocks)
        for _ in range(args.gsp_questions):
            q = rng.randint(lo, hi)
            reqs.append({"input_length": sys_blocks * BLOCK_TOKENS + q,
                         "output_length": args.gsp_output_tokens,
                         "hash_ids": head + ids.take(blocks_for(q))})
    rng.shuffle(reqs)
    t = 0.0
    for r in reqs:
        r["timestamp"] = t
        t += rng.expovariate(1.0) * 1000.0
    return reqs


def workload_chat(args, rng):
    """Conversations starting at Poisson times (mean gap 1 s before
    scaling). One conversation is one token stream: a system prompt from a
    pool of --chat-system-prompts (--chat-system-tokens each), then its
    own text; turn k's prompt is the stream's first L_k tokens, L_1
    uniform in --chat-first-tokens, each next turn adds the answer and a
    user message (uniform in --chat-turn-tokens) up to --max-prompt
    (at most --chat-max-turns turns). Think time between turns uniform in
    [0.5, 1.5] x --chat-think (in units of the start gap); a turn names
    the previous one in "after"."""
    ids = Ids(20_000_000)
    sys_blocks = blocks_for(args.chat_system_tokens)
    pool = [ids.take(sys_blocks) for _ in range(args.chat_system_prompts)]
    lo1, hi1 = args.chat_first_tokens
    lo, hi = args.chat_turn_tokens
    out = []
    start = 0.0
    for c in range(args.chat_conversations):
        lens = [rng.randint(lo1, hi1)]
        while len(lens) < args.chat_max_turns:
            nxt = lens[-1] + rng.randint(lo, hi)
            if nxt > args.max_prompt:
                break
            lens.append(nxt)
        stream = rng.choice(pool) + ids.take(blocks_for(lens[-1]) -
                                             sys_blocks)
        t = start
        for k, n in enumerate(lens):
            answer = (lens[k + 1] - n) // 3 if k + 1 < len(lens) else \
                rng.randint(lo, hi) // 3
            out.append({"timestamp": t * 1000.0, "input_length": n,
                        "output_length": max(1, answer),
                        "hash_ids": stream[:blocks_for(n)],
                        "conv": c, "turn": k})
            t += args.chat_think * rng.uniform(0.5, 1.5)
        start += rng.expovariate(1.0)
    out.sort(key=lambda r: r["timestamp"])
    last = {}
    for i, r in enumerate(out):
        if r["conv"] in last:
            r["after"] = last[r["conv"]]
        last[r["conv"]] = i
    return out


def build_workload(args, name, rng):
    if name == "mooncake":
        return workload_mooncake(args, rng)
    if name == "gsp":
        return workload_gsp(args, rng)
    return workload_chat(args, rng)


# ---------------------------------------------------------------- scaling


def lru_uncached(reqs, workers, capacity, assign):
    """Prompt tokens each worker computes (not cached) when request i goes
    to assign(i): per worker an LRU of blocks holding `capacity` tokens,
    a block cached as its full pages, hits counted on the leading blocks
    (as the oracle does). Reservations of running requests are ignored."""
    caches = [collections.OrderedDict() for _ in range(workers)]
    used = [0] * workers
    out = [0] * workers
    for i, r in enumerate(reqs):
        w = assign(i)
        c = caches[w]
        lens = block_lengths(r)
        hit = 0
        for b, n in zip(r["hash_ids"], lens):
            s = c.get(b, 0)
            hit += min(s, n)
            if s < n:
                break
        out[w] += sum(lens) - hit
        for b, n in zip(r["hash_ids"], lens):
            full = n // PAGE_SIZE * PAGE_SIZE
            s = c.get(b, 0)
            if s < full:
                used[w] += full - s
                c[b] = full
            if b in c:
                c.move_to_end(b)
        while used[w] > capacity and c:
            _, n = c.popitem(last=False)
            used[w] -= n
    return out


def plan(args, name, reqs, fleet_rate):
    """Sizes the fleet for reqs and scales their timestamps (in place, to
    model-time ms) so that round robin's predicted prefill work is
    --target-util of fleet_rate (tokens/s, model time) over the replay;
    returns the workload's facts."""
    distinct = {}
    for r in reqs:
        for b, n in zip(r["hash_ids"], block_lengths(r)):
            distinct[b] = max(distinct.get(b, 0), n)
    working = sum(distinct.values())
    cap = math.ceil(working / WORKERS / PAGE_SIZE) * PAGE_SIZE
    out_cap = [min(r["output_length"], args.max_output) for r in reqs]
    longest = max(r["input_length"] + o for r, o in zip(reqs, out_cap))
    cap = max(cap, math.ceil(2 * longest / PAGE_SIZE) * PAGE_SIZE)
    for r, o in zip(reqs, out_cap):
        r["output_length"] = max(1, o)
    hit, total = oracle_bound(reqs)
    rr = lru_uncached(reqs, WORKERS, cap, lambda i: i % WORKERS)
    work = sum(rr)
    span = reqs[-1]["timestamp"] / 1000.0
    real_span = work / (args.target_util * fleet_rate)
    factor = real_span / span if span > 0 else 1.0
    for r in reqs:
        r["timestamp"] *= factor
    info = {
        "name": name, "n": len(reqs), "prompt_tokens": total,
        "working": working, "kv_capacity": cap, "longest": longest,
        "oracle": hit / total if total else 0.0,
        "rr_uncached": work, "rr_predicted_util": args.target_util,
        "span": real_span, "factor": factor,
        "prompt_min": min(r["input_length"] for r in reqs),
        "prompt_max": max(r["input_length"] for r in reqs),
        "prompt_mean": total / len(reqs),
    }
    if name == "chat":
        info["conversations"] = len({r["conv"] for r in reqs})
        info["think"] = args.chat_think * factor
    return info


# ---------------------------------------------------------------- runs


def variant_flags(args, variant):
    policy, _, mode = variant.partition("@")
    flags = ["--policy", policy, "--frontends", str(args.cores)]
    if mode != "default":
        flags += ["--load-monitor-interval", str(args.interval)]
    return flags + args.smg_flag


def worker_args(args, info, rate):
    return ["--page-size", str(PAGE_SIZE),
            "--kv-capacity", str(info["kv_capacity"]),
            "--context-length", str(max(32768, info["longest"])),
            "--prefill-tps", f"{rate:g}",
            "--decode-base-ms", f"{args.decode_base_ms:g}",
            "--decode-per-req-ms", f"{args.decode_per_req_ms:g}",
            "--max-running", str(args.max_running),
            "--max-prefill-tokens", str(args.max_prefill_tokens),
            "--time-scale", f"{args.time_scale:g}"]


def run_one(args, procs, info, reqs, bodies, variant, rates):
    """Fresh fleet (one worker per rate), fresh smg with the variant's
    flags, one replay; the run's figures."""
    children0 = rusage_secs(resource.RUSAGE_CHILDREN)
    # A fresh name per run: a log left by an earlier run of the same
    # variant must not be read as this one's.
    tag = f"{info['name']}-{'u' if len(set(rates)) > 1 else 'e'}-" \
        f"{variant.replace('@', '-')}-{next(RUN_SEQ)}"
    fleet = Fleet(procs, args.simworker, tag,
                  [worker_args(args, info, r) for r in rates])
    proc = None
    try:
        proc, port = start_smg_target(
            procs, args.smg, "smg-" + tag,
            variant_flags(args, variant) + ["--worker-urls"] + fleet.urls(),
            WORKERS, args.ready_timeout)
        fleet.reset()
        host0 = host_cpu()
        results, wall, _ = asyncio.run(replay(
            port, reqs, bodies, args.time_scale, args.read_batch,
            args.request_timeout))
        host1 = host_cpu()
        stats = fleet.stats()
        dead = fleet.dead() + \
            ([proc.bench_name] if proc.poll() is not None else [])
    finally:
        if proc is not None:
            procs.stop(proc)
        fleet.stop()
    f = figures(args, info, results, wall, stats, rates)
    f["dead"] = dead
    f["cpu_children"] = rusage_secs(resource.RUSAGE_CHILDREN) - children0
    f["host_busy"] = (host1[0] - host0[0]) / max(host1[1] - host0[1], 1e-9)
    return f


def figures(args, info, results, wall, stats, rates):
    s = args.time_scale
    ok = [r for r in results if r.error is None]
    ttft = [r.ttft * s for r in ok if r.ttft is not None]
    prompt = sum(x["prompt_tokens"] for x in stats)
    cached = sum(x["cached_tokens"] for x in stats)
    counts = [x["requests"] for x in stats]
    mean = sum(counts) / len(counts)
    model_wall = wall * s
    util = [(x["prompt_tokens"] - x["cached_tokens"]) / (rate * model_wall)
            for x, rate in zip(stats, rates)]
    by_worker = collections.defaultdict(list)
    for r in ok:
        if r.ttft is not None and r.worker is not None:
            by_worker[r.worker].append(r.ttft * s)
    errors = collections.Counter(r.error.split(":")[0] for r in results
                                 if r.error is not None)
    f = {
        "n": len(results), "ok": len(ok),
        "hit": cached / prompt if prompt else 0.0,
        "busiest": max(counts) / mean if mean else None,
        "counts": counts,
        "p50": quantile(ttft, 0.5) if ttft else None,
        "p90": quantile(ttft, 0.9) if ttft else None,
        "p99": quantile(ttft, 0.99) if ttft else None,
        "util": sum((x["prompt_tokens"] - x["cached_tokens"])
                    for x in stats) / (sum(rates) * model_wall),
        "util_max": max(util),
        "wall": wall,
        "lag_p99": quantile([r.lag for r in results], 0.99),
        "errors": dict(errors),
    }
    slow = [i for i, r in enumerate(rates) if r < max(rates)]
    if slow:
        i = slow[0]
        fast = [j for j in range(len(rates)) if j not in slow]
        f["slow_share"] = counts[i] / (sum(counts[j] for j in fast) /
                                       len(fast)) if fast else None
        mine = by_worker.get(f"w{i + 1}", [])
        others = [t for j in fast for t in by_worker.get(f"w{j + 1}", [])]
        f["slow_p50"] = quantile(mine, 0.5) if mine else None
        f["fast_p50"] = quantile(others, 0.5) if others else None
    return f


# ---------------------------------------------------------------- report


def ms(x):
    return "n/a" if x is None else f"{1000 * x:.0f}"


def ratio(a, b):
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def title(variant):
    p, _, mode = variant.partition("@")
    return f"{p}, default flags" if mode == "default" else p


def result_rows(info, res, variants, unequal):
    base = res.get(BASELINE)
    base = base if base and "unavailable" not in base else None
    rows = []
    for v in variants:
        r = res.get(v)
        if r is None or "unavailable" in r:
            why = "not run (interrupted)" if r is None else r["unavailable"]
            rows.append([title(v), why] + [""] * (12 if unequal else 10))
            continue
        err = sum(r["errors"].values())
        errtxt = "0" if not err else "**" + ", ".join(
            f"{k} {n}" for k, n in r["errors"].items()) + "**"
        row = [title(v),
               f"{r['hit'] / info['oracle']:.2f}" if info["oracle"] else
               "n/a",
               f"{r['busiest']:.2f} ({'/'.join(map(str, r['counts']))})",
               ms(r["p50"]), ms(r["p90"]), ms(r["p99"])]
        for q in ("p50", "p90", "p99"):
            row.append(ratio(r[q], base[q]) if base else "n/a")
        row.append(f"{100 * r['util']:.0f}%/{100 * r['util_max']:.0f}%")
        if unequal:
            row.append("n/a" if r.get("slow_share") is None
                       else f"{r['slow_share']:.2f}")
            row.append(ratio(r.get("slow_p50"), r.get("fast_p50")))
        row += [f"{100 * r['host_busy']:.0f}% / {r['cpu_children']:.0f} / "
                f"{1000 * r['lag_p99']:.0f}", errtxt]
        rows.append(row)
    head = ["policy", "hit / oracle", "busiest / mean (requests)",
            "TTFT p50 ms", "p90 ms", "p99 ms", "p50 / rr", "p90 / rr",
            "p99 / rr", "prefill util mean/max"]
    align = "lrlrrrrrrl"
    if unequal:
        head += ["slow / full-speed requests", "slow p50 / others' p50"]
        align += "rr"
    head += ["host busy / our CPU s / late p99 ms", "errors"]
    align += "rl"
    return md_table(head, align, rows)


def describe(args, info):
    name = info["name"]
    if name == "mooncake":
        what = (f"`{os.path.relpath(args.trace, ROOT)}`: whole prefix "
                f"trees (requests grouped by first block) drawn at random "
                f"until {args.mooncake_requests} requests, prompts up to "
                f"{args.max_prompt} tokens; trace time x "
                f"{info['factor']:.3f}")
    elif name == "gsp":
        lo, hi = args.gsp_question_tokens
        what = (f"generated shared prefix: {args.gsp_groups} groups x "
                f"{args.gsp_questions} questions, system prompt "
                f"{blocks_for(args.gsp_system_tokens) * BLOCK_TOKENS} "
                f"tokens, question {lo}-{hi} tokens, shuffled, Poisson "
                f"arrivals")
    else:
        lo1, hi1 = args.chat_first_tokens
        lo, hi = args.chat_turn_tokens
        what = (f"multi-round chat: {info['conversations']} conversations, "
                f"{info['n']} turns, first prompt {lo1}-{hi1} tokens, +"
                f"{lo}-{hi} tokens a turn up to {args.max_prompt}, "
                f"{args.chat_system_prompts} shared system prompts of "
                f"{blocks_for(args.chat_system_tokens) * BLOCK_TOKENS} "
                f"tokens; think time ~{info['think']:.0f} s, a turn waits "
                f"for the previous one")
    return [
        f"- workload: {what}",
        f"- {info['n']} requests, prompts {info['prompt_min']}-"
        f"{info['prompt_max']} tokens (mean {info['prompt_mean']:.0f}), "
        f"{info['prompt_tokens'] / 1e6:.1f} M prompt tokens; **oracle "
        f"{100 * info['oracle']:.1f}%**; working set "
        f"{info['working'] / 1e6:.2f} M tokens, --kv-capacity "
        f"{info['kv_capacity']} per worker",
        f"- scaled to {info['span']:.0f} s of model time "
        f"({info['span'] / args.time_scale:.0f} s wall): round robin "
        f"predicted to compute {info['rr_uncached'] / 1e6:.1f} M tokens = "
        f"{100 * args.target_util:.0f}% of the fleet's prefill capacity" +
        ("" if "measured" not in info else
         "; it measured " + ", then ".join(f"{100 * u:.0f}%"
                                          for u in info["measured"]) +
         ", so time was rescaled from what it measured and it ran again "
         "(the table has its last run)") +
        ("" if info.get("calib", 1.0) == 1.0 else
         f"; time x {info['calib']:.3f} as the equal fleet's was corrected"),
    ]


def report(args, m, infos, res, elapsed):
    L = ["# Routing quality on multi-turn traffic\n"]
    L.append(f"- date: {m['date']}; commit {m['commit']}; build "
             f"`{args.build_dir}` ({args.build_type})")
    L.append(f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['kernel']}; "
             f"Python {m['python']}; load average at start "
             f"{m['load']:.2f}; whole run {elapsed / 60:.1f} min")
    L.append(f"- command: `{' '.join(args.argv)}`")
    L.append(f"- fleet: {WORKERS} smg-simworker, fresh for every row: "
             f"--page-size {PAGE_SIZE} (LRU), --prefill-tps "
             f"{args.prefill_tps:g} (model time), --decode-base-ms "
             f"{args.decode_base_ms:g}, --decode-per-req-ms "
             f"{args.decode_per_req_ms:g}, --max-running "
             f"{args.max_running}, --max-prefill-tokens "
             f"{args.max_prefill_tokens}, --time-scale "
             f"{args.time_scale:g}; "
             f"max_tokens capped at {args.max_output}")
    L.append(f"- smg: `--policy P --frontends {args.cores} "
             f"--load-monitor-interval {args.interval}` "
             f"({args.real_interval:g} s of model time); \"default flags\" "
             f"leaves the interval at its default (10 s wall = "
             f"{10 * args.time_scale:g} s of model time)")
    L.append("")
    for name in args.equal_list:
        info = infos.get(name)
        if info is None:
            continue
        L.append(f"## {name}\n")
        L += describe(args, info)
        L.append("")
        L += result_rows(info, res.get((name, "equal"), {}),
                         args.variant_list, False)
        L.append("")
    name = args.unequal_workload
    if args.unequal and name + "@unequal" in infos:
        info = infos[name + "@unequal"]
        L.append(f"## {name}, one worker at half the prefill rate\n")
        L.append(f"- w4 at --prefill-tps {args.prefill_tps / 2:g}, the "
                 f"others at {args.prefill_tps:g}; the same requests, "
                 f"time scaled for this fleet's capacity (round robin "
                 f"gives the slow worker a quarter of the work, 1.4x "
                 f"what it can take at this load: it does not calibrate "
                 f"here)")
        L += describe(args, info)[2:]
        L.append("")
        L += result_rows(info, res.get((name, "unequal"), {}),
                         args.unequal_list, True)
        L.append("")
    L += [
        "- hit / oracle: Σ cached_tokens / Σ prompt_tokens from the "
        "workers' GET /sim/stats, over the oracle: the share of prompt "
        "tokens in leading blocks already seen earlier in the workload "
        "(unbounded caches, perfect placement)",
        "- busiest / mean: most requests one worker completed over the "
        "mean (per-worker counts w1/w2/w3/w4)",
        f"- TTFT: model time (wall x {args.time_scale:g}) from a request's "
        "scheduled send (for a chat turn: or the end of the previous turn, "
        "if later) to its first SSE data event, at the client; successful "
        "requests only; x / rr: over round robin's in the same table",
        "- prefill util: uncached prompt tokens / (prefill rate x the "
        "run's duration), fleet and busiest worker",
        "- slow / full-speed requests: requests w4 completed over the mean "
        "of w1-w3; slow p50 / others' p50: TTFT p50 of the requests w4 "
        "answered (x-sim-worker) over that of the others",
        "- host busy: all CPUs of the host during the replay, other work "
        "included (near 100% the TTFT figures carry host noise); our CPU "
        "s: CPU seconds smg and the workers used in the row; late p99: "
        "how late the client sent requests (wall ms, p99; counted in "
        "TTFT, which runs from the scheduled time)",
    ]
    for key, r in sorted(res.items()):
        for v, x in r.items():
            if x.get("dead"):
                L.append(f"- **{key[0]} {key[1]} {v}: {', '.join(x['dead'])} "
                         f"exited during the run**")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- main


def pair(s):
    a, _, b = s.partition(",")
    lo, hi = int(a), int(b or a)
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"{s!r}: want LO,HI with "
                                         f"1 <= LO <= HI")
    return lo, hi


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Routing quality of every smg-c policy on multi-turn "
                    "workloads over four simworkers, one run.")
    add_build_dir(ap, "holds smg and smg-simworker")
    add_out(ap)
    ap.add_argument("--smg-flag", action="append", default=[],
                    help="one more smg flag (or value) for every smg-c row; "
                    "repeat it, e.g. --smg-flag=--least-load-kv-pressure-"
                    "weight --smg-flag=0")
    ap.add_argument("--quick", action="store_true",
                    help="smaller workloads and fewer policies (~3 min)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--policies", default=None,
                    help=f"comma-separated, of {','.join(VARIANTS)} "
                         f"(default: {','.join(FULL_VARIANTS)}; quick: "
                         f"{','.join(QUICK_VARIANTS)})")
    ap.add_argument("--unequal-policies", default=None,
                    help=f"policies run over the unequal fleet ('' none; "
                         f"default: {','.join(UNEQUAL_VARIANTS)}; quick: "
                         f"{','.join(QUICK_UNEQUAL_VARIANTS)})")
    ap.add_argument("--unequal-workload", default="mooncake",
                    choices=WORKLOADS)
    ap.add_argument("--trace", default=DEFAULT_TRACE)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target-util", type=float, default=0.8,
                    help="round robin's predicted prefill utilisation")
    ap.add_argument("--prefill-tps", type=float, default=10000,
                    help="a worker's prefill tokens/s, model time")
    ap.add_argument("--time-scale", type=float, default=10,
                    help="the simworkers and the replay run this many "
                         "times faster than model time")
    ap.add_argument("--real-interval", type=float, default=10,
                    help="load-monitor interval in model time; over "
                         "--time-scale it must be a whole number of seconds")
    ap.add_argument("--decode-base-ms", type=float, default=10)
    ap.add_argument("--decode-per-req-ms", type=float, default=0.1)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--max-prefill-tokens", type=int, default=16384,
                    help="uncached tokens one engine step admits (SGLang's "
                         "max_prefill_tokens; the first request of a step "
                         "always goes in; 0: no limit)")
    ap.add_argument("--max-output", type=int, default=32,
                    help="cap on a request's max_tokens (TTFT is measured; "
                         "long answers only cost the client CPU)")
    ap.add_argument("--max-prompt", type=int, default=61440)
    ap.add_argument("--mooncake-requests", type=int, default=None)
    ap.add_argument("--gsp-groups", type=int, default=None)
    ap.add_argument("--gsp-questions", type=int, default=16)
    ap.add_argument("--gsp-system-tokens", type=int, default=8192)
    ap.add_argument("--gsp-question-tokens", type=pair, default=(128, 512))
    ap.add_argument("--gsp-output-tokens", type=int, default=256)
    ap.add_argument("--chat-conversations", type=int, default=None)
    ap.add_argument("--chat-first-tokens", type=pair, default=(6000, 12000))
    ap.add_argument("--chat-turn-tokens", type=pair, default=(2000, 8000))
    ap.add_argument("--chat-max-turns", type=int, default=12)
    ap.add_argument("--chat-system-prompts", type=int, default=4)
    ap.add_argument("--chat-system-tokens", type=int, default=2048)
    ap.add_argument("--chat-think", type=float, default=10.0,
                    help="mean think time in units of the mean gap "
                         "between conversation starts")
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                    help="smg frontends")
    ap.add_argument("--request-timeout", type=float, default=120.0,
                    help="wall seconds; a request open longer is an error")
    ap.add_argument("--read-batch", type=float, default=0.05)
    ap.add_argument("--ready-timeout", type=float, default=30.0)
    ap.add_argument("--keep-tmp", action="store_true")
    args = ap.parse_args(argv)
    args.argv = ["/usr/bin/python3",
                 os.path.relpath(os.path.abspath(__file__), os.getcwd())] + \
        argv
    sizes = {"mooncake_requests": (700, 250), "gsp_groups": (32, 12),
             "chat_conversations": (28, 10)}
    for k, (full, quick) in sizes.items():
        if getattr(args, k) is None:
            setattr(args, k, quick if args.quick else full)
    if args.unequal_policies is None:
        args.unequal_policies = ",".join(QUICK_UNEQUAL_VARIANTS if args.quick
                                         else UNEQUAL_VARIANTS)
    if args.policies is None:
        args.policies = ",".join(QUICK_VARIANTS if args.quick
                                 else FULL_VARIANTS)

    def names(s, allowed, what):
        out = [x.strip() for x in s.split(",") if x.strip()]
        for x in out:
            if x not in allowed:
                ap.error(f"unknown {what} {x!r} (of {','.join(allowed)})")
        return out
    args.workload_list = names(args.workloads, WORKLOADS, "workload")
    args.equal_list = list(args.workload_list)
    args.variant_list = names(args.policies, VARIANTS, "policy")
    args.unequal_list = names(args.unequal_policies, VARIANTS, "policy")
    args.unequal = bool(args.unequal_list)
    if args.unequal and args.unequal_workload not in args.workload_list:
        args.workload_list.append(args.unequal_workload)
    if not 0 < args.target_util <= 2 or args.prefill_tps <= 0 or \
            args.time_scale <= 0 or args.real_interval <= 0:
        ap.error("--target-util, --prefill-tps, --time-scale and "
                 "--real-interval must be > 0")
    iv = args.real_interval / args.time_scale
    if iv < 1 or abs(iv - round(iv)) > 1e-9:
        ap.error(f"--real-interval / --time-scale = {iv:g}: smg's "
                 f"--load-monitor-interval takes whole seconds >= 1")
    args.interval = int(round(iv))
    for k in ("mooncake_requests", "gsp_groups", "gsp_questions",
              "chat_conversations", "chat_max_turns", "chat_system_prompts",
              "max_output", "max_prompt", "gsp_system_tokens",
              "chat_system_tokens"):
        if getattr(args, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    args.build_dir = os.path.abspath(args.build_dir)
    args.build_type = build_type(args.build_dir)
    args.smg = os.path.join(args.build_dir, "smg")
    args.simworker = os.path.join(args.build_dir, "smg-simworker")
    for b in (args.smg, args.simworker):
        if not os.access(b, os.X_OK):
            ap.error(f"{b}: not found or not executable; build it first "
                     f"(BUILD_TYPE=Release ./scripts/build.sh) or pass "
                     f"--build-dir")
    if "mooncake" in args.workload_list and not os.path.isfile(args.trace):
        ap.error(f"{args.trace}: no such trace (--trace)")
    return args


def run_all(args, procs, infos, res):
    rng = random.Random(args.seed)
    for name in args.workload_list:
        reqs = build_workload(args, name, rng)
        if not reqs:
            raise ValueError(f"{name}: no requests")
        base = [dict(r) for r in reqs]
        todo = []
        if name in args.equal_list:
            todo.append(("equal", args.variant_list,
                         [args.prefill_tps] * WORKERS))
        if args.unequal and name == args.unequal_workload:
            todo.append(("unequal", args.unequal_list,
                         [args.prefill_tps] * (WORKERS - 1) +
                         [args.prefill_tps / 2]))
        calib = 1.0  # the equal fleet's correction of the prediction
        for fleet_kind, variants, rates in todo:
            reqs = [dict(r) for r in base]
            info = plan(args, name, reqs, sum(rates))
            if calib != 1.0:
                stretch(reqs, info, calib)
            if fleet_kind == "equal" or name not in infos:
                infos[name] = info
            log(f"{name} ({fleet_kind}): {info['n']} requests, "
                f"{info['prompt_tokens'] / 1e6:.1f} M prompt tokens, oracle "
                f"{100 * info['oracle']:.1f}%, {info['span']:.0f} s model "
                f"time ({info['span'] / args.time_scale:.0f} s wall), kv "
                f"{info['kv_capacity']} per worker")
            bodies = Bodies(reqs)
            out = res.setdefault((name, fleet_kind), {})
            order = sorted(variants, key=lambda v: v != BASELINE)
            for v in order:
                f = run_variant(args, procs, info, reqs, bodies, v, rates,
                                fleet_kind)
                tries = 0
                # The prediction can miss (hits it did not foresee, the
                # drain after the last arrival, chat turns waiting for
                # their predecessors): rescale the arrivals from what
                # round robin measured and run it again, at most twice.
                # Not over the unequal fleet, where round robin overloads
                # the slow worker by design and its drain says nothing of
                # the offered load: that fleet takes the equal fleet's
                # correction.
                while fleet_kind == "equal" and v == BASELINE and \
                        f is not None and "util" in f and \
                        abs(f["util"] - args.target_util) > UTIL_SLACK \
                        and tries < 2:
                    tries += 1
                    k = rescale(args, info, f, sum(rates))
                    stretch(reqs, info, k)
                    calib *= k
                    info.setdefault("measured", []).append(f["util"])
                    log(f"{name} {fleet_kind}: round robin measured "
                        f"{100 * f['util']:.0f}% utilisation; time x "
                        f"{k:.3f}, again")
                    f = run_variant(args, procs, info, reqs, bodies, v,
                                    rates, fleet_kind)
                out[v] = f
            if fleet_kind == "unequal":
                infos[name + "@unequal"] = info
                info["calib"] = calib


def stretch(reqs, info, k):
    """Multiplies the arrival times of reqs (and info's spans) by k."""
    for r in reqs:
        r["timestamp"] *= k
    info["span"] *= k
    info["factor"] *= k
    if "think" in info:
        info["think"] *= k


def rescale(args, info, f, fleet_rate):
    """Factor on the (current) arrival times that brings round robin's measured
    utilisation f["util"] to --target-util: the work measured stays, the
    time after the last arrival (measured duration - arrival span) is
    taken as fixed."""
    duration = f["wall"] * args.time_scale
    work = f["util"] * fleet_rate * duration
    tail = max(0.0, duration - info["span"])
    want = work / (args.target_util * fleet_rate) - tail
    return max(0.25, min(4.0, want / info["span"]))


def run_variant(args, procs, info, reqs, bodies, v, rates, fleet_kind):
    """run_one() with its failures turned into a row saying why."""
    name = info["name"]
    try:
        f = run_one(args, procs, info, reqs, bodies, v, rates)
    except NotAvailable as e:
        log(f"{name} {v}: not available: {e}")
        return {"unavailable": "not available: " +
                str(e)[:160].replace("|", "/")}
    except (RuntimeError, OSError, ValueError,
            http.client.HTTPException) as e:
        log(f"{name} {v}: run failed: {e}")
        return {"unavailable": "run failed: " +
                str(e)[:160].replace("|", "/")}
    log(f"{name} {fleet_kind} {v}: hit/oracle "
        f"{f['hit'] / info['oracle']:.2f}, busiest {f['busiest']:.2f}, "
        f"ttft p50/p90/p99 {ms(f['p50'])}/{ms(f['p90'])}/{ms(f['p99'])} "
        f"ms, util {100 * f['util']:.0f}%, errors "
        f"{sum(f['errors'].values())}, host busy "
        f"{100 * f['host_busy']:.0f}%, client late p99 "
        f"{1000 * f['lag_p99']:.0f} ms, wall {f['wall']:.0f} s")
    return f


def main(argv):
    args = parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    m = machine()
    tmp = tempfile.mkdtemp(prefix="smg-routing-")
    procs = Procs(tmp, log)
    infos, res = {}, {}
    t0 = time.monotonic()
    trap_signals()
    rc = 0
    try:
        run_all(args, procs, infos, res)
    except Interrupted as e:
        log(f"interrupted ({e}); reporting what was measured")
        rc = 130
    finally:
        finish(procs, tmp, args.keep_tmp, log)
    text = report(args, m, infos, res, time.monotonic() - t0)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
