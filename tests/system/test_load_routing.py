"""Load-aware routing with simworkers: least_load and power_of_two send
most traffic to the faster of two unequal workers and log each decision
with its score at debug level."""
import collections
import re
import threading

import gw
import sim

MODEL = "sim-model"
# About 1000 prompt tokens (the simworker counts 4 characters a token),
# near least_load's assumed prefill length.
BODY = {"model": MODEL, "prompt": "the quick brown fox " * 200,
        "max_tokens": 8}


def drive(g, clients, per_client):
    """clients threads each sending per_client requests through the
    gateway; returns a Counter of the routed worker URLs."""
    seen = collections.Counter()
    lock = threading.Lock()

    def run():
        for i in range(per_client):
            # Distinct prompts: no prefix-cache hits, real queued work.
            body = dict(BODY, prompt=f"{threading.get_ident()} {i} " +
                        BODY["prompt"])
            r = g.post("/v1/completions", body, timeout=30)
            assert r.status == 200, r
            with lock:
                seen[r.headers["x-smg-routed-worker-id"]] += 1
    ts = [threading.Thread(target=run) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return seen


def test_least_load_prefers_the_faster_worker(tmp_path):
    fast = sim.start_simworker(tmp_path)
    slow = sim.start_simworker(tmp_path, "--max-running", "1",
                               "--decode-base-ms", "40",
                               "--prefill-tps", "2000")
    try:
        with gw.start_gateway(tmp_path, "--policy", "least_load",
                              "--worker-urls", slow.url, fast.url,
                              "--load-monitor-interval", "1",
                              "--log-level", "debug") as g:
            g.wait_ready(2)
            seen = drive(g, 4, 12)
            assert sum(seen.values()) == 48
            assert seen[fast.url] >= 2 * seen[slow.url], seen
            assert re.search(r"least_load selected http://127\.0\.0\.1:\d+ "
                             r"\(score \d+\.\d+, in_flight \d+",
                             g.log()), g.log()[-2000:]
            g.stop()
    finally:
        fast.stop()
        slow.stop()


def test_power_of_two_prefers_the_faster_worker(tmp_path):
    fast = sim.start_simworker(tmp_path)
    slow = sim.start_simworker(tmp_path, "--max-running", "1",
                               "--decode-base-ms", "40",
                               "--prefill-tps", "2000")
    try:
        with gw.start_gateway(tmp_path, "--policy", "power_of_two",
                              "--worker-urls", slow.url, fast.url,
                              "--load-monitor-interval", "1",
                              "--log-level", "debug") as g:
            g.wait_ready(2)
            seen = drive(g, 4, 10)
            assert seen[fast.url] >= 2 * seen[slow.url], seen
            assert "power_of_two selected " in g.log()
            g.stop()
    finally:
        fast.stop()
        slow.stop()
