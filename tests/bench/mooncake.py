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
import hashlib
import http.client
import json
import math
import os
import shlex
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from benchlib import (Interrupted, Procs, add_build_dir, add_out,
                      build_type, free_port, haproxy_conf, http_call, logger,
                      machine, md_table, nearest_rank, nginx_conf, smg_ready,
                      start_haproxy, start_nginx, start_simworker,
                      start_smg as spawn_smg, trap_signals)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_TRACE = os.path.join(os.path.dirname(ROOT), "shared", "data",
                             "mooncake-synthetic-trace.jsonl")
MODEL = "sim-model"
BLOCK_TOKENS = 512
CHARS_PER_TOKEN = 4  # the simworker's tokenizer: one token per 4 chars
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN
PAGE_SIZE = 16
WORKERS = 4
SMG_POLICIES = ("cache_aware", "prefix_hash", "consistent_hashing",
                "least_load", "round_robin")
TARGETS = SMG_POLICIES + ("nginx", "haproxy")
TITLES = {p: f"smg-c {p}" for p in SMG_POLICIES}
TITLES.update({"nginx": "nginx round robin",
               "haproxy": "HAProxy roundrobin"})
# Lines of the smg log that mean the broker refused the policy.
REFUSALS = ("not implemented", "unknown policy", "invalid value")
log = logger()
quantile = nearest_rank


class NotAvailable(Exception):
    pass


# ---------------------------------------------------------------- trace


def load_trace(path, n):
    reqs = []
    with open(path) as f:
        for ln in f:
            if ln.strip():
                reqs.append(json.loads(ln))
            if n and len(reqs) >= n:
                break
    for r in reqs:
        blocks = r["hash_ids"]
        if not blocks or not (len(blocks) - 1) * BLOCK_TOKENS < \
                r["input_length"] <= len(blocks) * BLOCK_TOKENS:
            raise ValueError(f"{path}: input_length {r['input_length']} "
                             f"does not match {len(blocks)} blocks")
    return reqs


def block_lengths(r):
    """Tokens of each block of r's prompt (the last one may be cut)."""
    n = r["input_length"]
    return [min(BLOCK_TOKENS, n - i * BLOCK_TOKENS)
            for i in range(len(r["hash_ids"]))]


def oracle_bound(reqs):
    """Share of prompt tokens a perfect router could serve from cache:
    walking each prompt's blocks from the start, a block's tokens count
    while an earlier request held at least as many tokens of that block
    (a block seen only cut shorter counts its seen part and ends the
    prefix); the first block not seen ends it too. Caches are unbounded
    here. Returns (hit tokens, prompt tokens)."""
    seen = {}  # block id -> most tokens of it any earlier prompt had
    hit = total = 0
    for r in reqs:
        lens = block_lengths(r)
        total += sum(lens)
        for b, n in zip(r["hash_ids"], lens):
            s = seen.get(b, 0)
            hit += min(s, n)
            if s < n:
                break
        for b, n in zip(r["hash_ids"], lens):
            if seen.get(b, 0) < n:
                seen[b] = n
    return hit, total


def block_text(bid):
    """2,048 characters (512 tokens) unique to block id bid: hex of
    BLAKE2b over (id, counter). Equal ids give equal text."""
    parts = [hashlib.blake2b(f"mooncake-block:{bid}:{k}".encode(),
                             digest_size=64).hexdigest()
             for k in range(BLOCK_CHARS // 128)]
    return "".join(parts).encode()


class Bodies:
    """Request bodies built on demand from cached block texts."""

    def __init__(self, reqs):
        self.text = {}
        for r in reqs:
            for b in r["hash_ids"]:
                if b not in self.text:
                    self.text[b] = block_text(b)

    def prompt(self, r):
        s = b"".join(self.text[b] for b in r["hash_ids"])
        return s[:r["input_length"] * CHARS_PER_TOKEN]

    def body(self, r):
        head = json.dumps({"model": MODEL,
                           "max_tokens": max(1, r["output_length"]),
                           "stream": True})
        # The prompt is hex: no JSON escaping needed.
        return head[:-1].encode() + b', "prompt": "' + self.prompt(r) + \
            b'"}'


class Fleet:
    """The four simworkers of one target."""

    def __init__(self, procs, args, tag):
        self.procs = procs
        self.ports = []
        self.plist = []
        for i in range(WORKERS):
            name = f"{tag}-w{i + 1}"
            p, port = start_simworker(procs, args.simworker, name, [
                "--host", "127.0.0.1", "--model", MODEL,
                "--worker-id", f"w{i + 1}",
                "--page-size", str(PAGE_SIZE),
                "--kv-capacity", str(args.kv_capacity),
                "--context-length", str(args.context_length),
                "--prefill-tps", str(args.prefill_tps),
                "--decode-base-ms", str(args.decode_base_ms),
                "--decode-per-req-ms", str(args.decode_per_req_ms),
                "--max-running", str(args.max_running),
                "--time-scale", str(args.time_scale),
                "--log-level", "warn"])
            self.plist.append(p)
            self.ports.append(port)

    def urls(self):
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def reset(self):
        for p in self.ports:
            for path in ("/flush_cache", "/sim/reset_stats"):
                st, _, data = http_call(p, "POST", path)
                if st != 200:
                    raise RuntimeError(f"worker {p} {path}: HTTP {st}: "
                                       f"{data[:100]!r}")

    def stats(self):
        out = []
        for p in self.ports:
            st, _, data = http_call(p, "GET", "/sim/stats")
            if st != 200:
                raise RuntimeError(f"worker {p} /sim/stats: HTTP {st}")
            out.append(json.loads(data))
        return out

    def dead(self):
        return [p.bench_name for p in self.plist if p.poll() is not None]

    def stop(self):
        for p in self.plist:
            self.procs.stop(p)


# ---------------------------------------------------------------- targets


def probe(port):
    """One short streamed request; None when answered correctly."""
    body = json.dumps({"model": MODEL, "prompt": "probe " * 8,
                       "max_tokens": 2, "stream": True}).encode()
    st, _, data = http_call(port, "POST", "/v1/completions", body)
    if st != 200:
        return f"HTTP {st}: {data[:160]!r}"
    if b"data: [DONE]" not in data:
        return f"stream without [DONE]: {data[-120:]!r}"
    return None


def refusal(log_path):
    """The log line saying the policy was refused, or None."""
    try:
        with open(log_path, errors="replace") as f:
            for ln in f:
                if "smg-broker" in ln and "error" in ln and \
                        any(m in ln for m in REFUSALS):
                    return ln.strip().split(": ", 1)[-1]
                if "smg-broker" in ln and "exited with status" in ln:
                    return ln.strip().split(": ", 1)[-1]
    except OSError:
        pass
    return None


def start_smg(procs, args, policy, fleet):
    name = f"smg-{policy}"
    p, port, _ = spawn_smg(procs, args.smg, name, [
        "--policy", policy, "--frontends", str(args.cores)] +
        shlex.split(args.smg_args) + ["--worker-urls"] + fleet.urls(),
        host="127.0.0.1")
    logf = os.path.join(procs.tmp, name + ".log")
    deadline = time.monotonic() + args.ready_timeout
    err = "not tried"
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise NotAvailable(refusal(logf) or
                               f"smg exited with status {p.returncode}")
        why = refusal(logf)
        if why:
            raise NotAvailable(why)
        try:
            ready, why_not = smg_ready(port, WORKERS)
            if ready:
                err = probe(port)
                # A broker that dies right after starting shows in the log.
                time.sleep(0.5)
                why = refusal(logf)
                if why:
                    raise NotAvailable(why)
                if err is None:
                    return p, port
            else:
                err = why_not
        except (OSError, http.client.HTTPException, ValueError) as e:
            err = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise NotAvailable(f"not ready after {args.ready_timeout:.0f}s: {err}")


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


class Result:
    __slots__ = ("idx", "sched", "lag", "status", "ttft", "e2e", "error")

    def __init__(self, idx, sched):
        self.idx = idx
        self.sched = sched
        self.lag = 0.0
        self.status = 0
        self.ttft = None
        self.e2e = None
        self.error = None


async def read_head(reader):
    line = await reader.readline()
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ValueError(f"bad status line {line[:60]!r}")
    status = int(parts[1])
    hdrs = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            raise ValueError("connection closed in the headers")
        k, _, v = line.decode("latin-1").partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs


class Chunked:
    """Incremental decoder of a chunked body: feed() raw bytes, get the
    payload pieces; done once the last chunk and trailers are in."""

    def __init__(self):
        self.buf = bytearray()
        self.done = False

    def feed(self, data):
        self.buf += data
        out = []
        while not self.done:
            eol = self.buf.find(b"\r\n")
            if eol < 0:
                break
            size = int(bytes(self.buf[:eol]).split(b";")[0].strip(), 16)
            if size == 0:
                if self.buf.find(b"\r\n\r\n", eol) < 0:
                    break  # trailers not complete yet
                self.done = True
                break
            if len(self.buf) < eol + 2 + size + 2:
                break
            out.append(bytes(self.buf[eol + 2:eol + 2 + size]))
            del self.buf[:eol + 2 + size + 2]
        return out


async def read_body(reader, writer, hdrs, feed, batch):
    """Calls feed(bytes) with the body as it arrives. Once feed() has
    returned True (the first token is in), the socket is read every batch
    seconds only, so a streamed answer costs a few reads, not one per
    event; later events are then timed to within batch."""
    transport = writer.transport
    chunked = "chunked" in hdrs.get("transfer-encoding", "").lower()
    left = int(hdrs["content-length"]) if not chunked and \
        "content-length" in hdrs else None
    dec = Chunked() if chunked else None
    slow = False
    while True:
        if slow and batch > 0:
            transport.pause_reading()
            await asyncio.sleep(batch)
            transport.resume_reading()
        data = await reader.read(1 << 20)
        if not data:
            if chunked or left:
                raise ValueError("connection closed in the body")
            return
        if dec is not None:
            for piece in dec.feed(data):
                slow = feed(piece) or slow
            if dec.done:
                return
        else:
            if left is not None:
                data = data[:left]
                left -= len(data)
            slow = feed(data) or slow
            if left == 0:
                return


async def one_request(port, body, res, batch):
    """Sends one streamed completion; fills res (times from its scheduled
    send time, so a late client does not hide queueing)."""
    loop = asyncio.get_running_loop()
    res.lag = loop.time() - res.sched
    writer = None
    state = {"tail": b"", "done": False, "err": b""}

    def feed(data):
        now = loop.time()
        if res.status != 200:
            if len(state["err"]) < 200:
                state["err"] += data[:200]
            return False
        if res.ttft is None and b"data: {" in state["tail"] + data:
            res.ttft = now - res.sched
        if not state["done"] and b"data: [DONE]" in state["tail"] + data:
            state["done"] = True
            res.e2e = now - res.sched
        state["tail"] = data[-16:]
        return res.ttft is not None

    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\n"
                     b"Host: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Accept: text/event-stream\r\n"
                     b"Connection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        await writer.drain()
        res.status, hdrs = await read_head(reader)
        await read_body(reader, writer, hdrs, feed, batch)
        if res.status != 200:
            res.error = f"HTTP {res.status}: " \
                f"{state['err'][:80].decode(errors='replace')}"
        elif not state["done"]:
            res.error = "stream ended without [DONE]"
    except asyncio.CancelledError:
        res.error = "timed out"
        raise
    except (OSError, ValueError, asyncio.IncompleteReadError) as e:
        res.error = f"{type(e).__name__}: {e}"[:120]
    finally:
        if writer is not None:
            writer.close()


async def sample_loads(ports, samples, stop):
    """Samples each worker's waiting queue (GET /v1/loads) every 0.5 s."""
    loop = asyncio.get_running_loop()

    def get(port):
        try:
            st, _, data = http_call(port, "GET", "/v1/loads", timeout=2)
            if st == 200:
                return json.loads(data)["loads"][0]["num_waiting_reqs"]
        except (OSError, http.client.HTTPException, ValueError, KeyError,
                IndexError):
            pass
        return None

    while not stop.is_set():
        row = await asyncio.gather(*(loop.run_in_executor(None, get, p)
                                     for p in ports))
        if all(x is not None for x in row):
            samples.append(row)
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            pass


async def replay(args, port, reqs, bodies, worker_ports):
    """Replays reqs against port; returns (results, wall seconds, waiting
    samples)."""
    loop = asyncio.get_running_loop()
    speed = args.speedup
    t0 = loop.time() + 0.5
    results = [Result(i, t0 + r["timestamp"] / 1000.0 / speed)
               for i, r in enumerate(reqs)]
    samples = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_loads(worker_ports, samples, stop))
    tasks = []
    for r, res in zip(reqs, results):
        delay = res.sched - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        body = bodies.body(r)
        tasks.append(asyncio.create_task(asyncio.wait_for(
            one_request(port, body, res, args.read_batch),
            args.request_timeout)))
    # Bounded drain: whatever is still running after the timeout is an
    # error (its wait_for has cancelled it by then).
    done, pending = await asyncio.wait(tasks,
                                       timeout=args.request_timeout + 5)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for res in results:
        if res.error is None and res.e2e is None:
            res.error = "timed out"
    stop.set()
    await sampler
    ends = [res.sched + res.e2e for res in results if res.e2e is not None]
    wall = (max(ends) if ends else loop.time()) - t0
    return results, wall, samples


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


def host_cpu():
    """(busy, total) CPU seconds of the whole host since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v) - idle) / hz, sum(v) / hz


def rusage_secs(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def run_target(args, procs, target, reqs, bodies):
    """Starts a fresh fleet and the target, replays; figures or raises
    NotAvailable."""
    children0 = rusage_secs(resource.RUSAGE_CHILDREN)
    fleet = Fleet(procs, args, target)
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
            replay(args, port, reqs, bodies, fleet.ports))
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
        procs.stop_all()
        if args.keep_tmp:
            log(f"kept {tmp}")
        else:
            subprocess.run(["rm", "-rf", tmp], check=False)
    text = report(args, m, info, res)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
