"""Load-aware routing with simworkers: least_load prefers the faster of
two unequal workers, logs each decision at debug level, and answers 503
no_available_workers when every worker is at the waiting cap;
power_of_two routes on the same scores; overload protection vetoes
workers over their threshold with a terminal 503 and Retry-After."""
import collections
import re
import threading
import time

import gw
import sim
import util

MODEL = "sim-model"
# About 1000 prompt tokens (the simworker counts 4 characters a token),
# near least_load's assumed prefill length.
BODY = {"model": MODEL, "prompt": "the quick brown fox " * 200,
        "max_tokens": 8}
QUICK = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


def busy(worker, n, max_tokens):
    """n concurrent completions straight to a worker (not through the
    gateway); returns the threads to join."""
    def one():
        util.post(worker.port, "/v1/completions",
                  {"model": MODEL, "prompt": "hello there",
                   "max_tokens": max_tokens}, timeout=30)
    ts = [threading.Thread(target=one) for _ in range(n)]
    for t in ts:
        t.start()
    return ts


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


def reported_waiting(g, url, at_least):
    pat = re.escape(url) + r" via loads: waiting (\d+)"
    vals = [int(v) for v in re.findall(pat, g.log())]
    return bool(vals) and vals[-1] >= at_least


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


def test_waiting_cap_everywhere_gives_503(tmp_path):
    slow = ("--max-running", "1", "--decode-base-ms", "100")
    w1 = sim.start_simworker(tmp_path, *slow)
    w2 = sim.start_simworker(tmp_path, *slow)
    threads = []
    try:
        with gw.start_gateway(tmp_path, "--policy", "least_load",
                              "--worker-urls", w1.url, w2.url,
                              "--least-load-max-waiting-requests", "2",
                              "--retry-max-retries", "2",
                              "--load-monitor-interval", "1",
                              "--log-level", "debug") as g:
            g.wait_ready(2)
            # 1 running + 2 waiting on each, for about 4 s.
            threads = busy(w1, 3, 40) + busy(w2, 3, 40)
            for w in (w1, w2):
                util.wait_for(lambda w=w: reported_waiting(g, w.url, 2),
                              timeout=6, what=f"{w.url} at the cap")
            r = g.post("/v1/completions", BODY, timeout=10)
            assert r.status == 503, r
            assert r.headers["x-smg-error-code"] == "no_available_workers"
            assert r.json()["error"]["code"] == "no_available_workers"
            assert "retry-after" not in r.headers
            assert "every candidate is at the waiting cap" in g.log()
            # A queue shrinks below the cap and is reported: served again.
            util.wait_for(
                lambda: g.post("/v1/completions", BODY).status == 200,
                timeout=8, what="served again")
            g.stop()
    finally:
        w1.stop()
        w2.stop()
        for t in threads:
            t.join(30)


def test_overload_protection_sheds(tmp_path):
    slow = ("--max-running", "1", "--decode-base-ms", "100")
    w1 = sim.start_simworker(tmp_path, *slow)
    w2 = sim.start_simworker(tmp_path, *slow)
    threads = []
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w1.url, w2.url,
                              "--worker-overload-waiting-requests", "2",
                              "--load-monitor-interval", "1",
                              "--log-level", "debug") as g:
            g.wait_ready(2)
            threads = busy(w1, 3, 40)
            util.wait_for(lambda: reported_waiting(g, w1.url, 2),
                          timeout=6, what="w1 overloaded")
            util.wait_for(lambda: f"worker {w1.url} overload on" in g.log(),
                          timeout=3, what="overload flag")
            # One overloaded: the other takes everything.
            for _ in range(6):
                r = g.post("/v1/completions", QUICK, timeout=10)
                assert r.status == 200, r
                assert r.headers["x-smg-routed-worker-id"] == w2.url
            assert 'smg_workers_overloaded{model="sim-model"} 1' in \
                g.metrics()
            # Both overloaded: terminal 503 with Retry-After.
            threads += busy(w2, 3, 40)
            util.wait_for(lambda: 'smg_workers_overloaded{model='
                          '"sim-model"} 2' in g.metrics(),
                          timeout=6, what="both overloaded")
            t0 = time.monotonic()
            r = g.post("/v1/completions", QUICK, timeout=10)
            assert r.status == 503, r
            assert r.headers["x-smg-error-code"] == "no_available_workers"
            assert r.headers["retry-after"] == "1"
            assert time.monotonic() - t0 < 1.0  # terminal: no retries
            assert re.search(r'smg_worker_overload_shed_total\{stage='
                             r'"selection"\} [1-9]', g.metrics())
            # Queues shrink below the threshold: the veto lifts.
            util.wait_for(lambda: 'smg_workers_overloaded{model='
                          '"sim-model"} 0' in g.metrics(),
                          timeout=8, what="overload cleared")
            assert g.post("/v1/completions", QUICK).status == 200
            g.stop()
    finally:
        w1.stop()
        w2.stop()
        for t in threads:
            t.join(30)
