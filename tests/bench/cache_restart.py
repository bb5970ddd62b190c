#!/usr/bin/env python3
"""Restart time of the broker with a full cache_aware tree.

Fills the string tree of one model up to --max-tree-size with unique
prompts through the gateway (4 simworkers, no simulated delays), stops the
gateway (SIGTERM flushes the write-behind queue), starts it again on the
same state dir and reports the journal replay time the broker logs, the
tree size before and after, and the broker's resident memory.

    SMG_BUILD_DIR=build-rel python3 tests/bench/cache_restart.py \
        --max-tree-size 67108864 --prompt-kb 16
"""
import argparse
import os
import pathlib
import random
import re
import shutil
import string
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "system"))
import gw  # noqa: E402
import sim  # noqa: E402

MODEL = "sim-model"


def tree_chars(g):
    m = re.search(r'smg_cache_tree_chars\{model="[^"]*"\} (\d+)', g.metrics())
    return int(m.group(1)) if m else 0


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fill(g, total_chars, prompt_chars, clients):
    n = max(1, total_chars // prompt_chars)
    counter = iter(range(n))
    lock = threading.Lock()
    errors = []

    def run():
        rnd = random.Random()
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            # Unique from the first char: no shared prefixes at all.
            head = f"{i:08d} "
            body = "".join(rnd.choices(string.ascii_letters + " ",
                                       k=prompt_chars - len(head)))
            r = g.post("/v1/completions", {"model": MODEL, "max_tokens": 1,
                                           "prompt": head + body},
                       timeout=60)
            if r.status != 200:
                errors.append(r.status)
    ts = [threading.Thread(target=run) for _ in range(clients)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return n, time.monotonic() - t0, errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tree-size", type=int, default=67108864)
    ap.add_argument("--fill", type=float, default=1.1,
                    help="chars sent, as a multiple of the cap")
    ap.add_argument("--prompt-kb", type=int, default=16)
    ap.add_argument("--clients", type=int, default=8)
    a = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="smg-cache-restart-"))
    ws = [sim.start_simworker(tmp, "--time-scale", "0",
                              "--context-length", "1000000")
          for _ in range(4)]
    args = ["--policy", "cache_aware", "--worker-urls",
            *[w.url for w in ws], "--max-tree-size", str(a.max_tree_size),
            "--eviction-interval", "1"]
    try:
        g = gw.start_gateway(tmp, *args)
        g.wait_ready(4)
        n, secs, errors = fill(g, int(a.max_tree_size * a.fill),
                               a.prompt_kb * 1024, a.clients)
        time.sleep(2.5)  # one eviction sweep updates the gauge
        before = tree_chars(g)
        rss_before = rss_kb(g.pids()["broker"][0])
        t0 = time.monotonic()
        g.stop()
        stop_secs = time.monotonic() - t0
        g = gw.start_gateway(tmp, *args)
        g.wait_ready(4)
        time.sleep(2.5)
        after = tree_chars(g)
        rss_after = rss_kb(g.pids()["broker"][0])
        line = re.findall(r"persist_restore: .*", g.log())[-1]
        g.stop()
        db = os.path.getsize(tmp / "state" / "data.mdb")
        print(f"cap {a.max_tree_size} chars; sent {n} prompts of "
              f"{a.prompt_kb} KB in {secs:.1f} s ({len(errors)} errors)")
        print(f"tree before stop {before} chars, broker RSS "
              f"{rss_before // 1024} MB; stop took {stop_secs:.2f} s")
        print(f"restart: {line}")
        print(f"tree after restart {after} chars, broker RSS "
              f"{rss_after // 1024} MB; LMDB file {db // (1024 * 1024)} MB")
    finally:
        for w in ws:
            w.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
