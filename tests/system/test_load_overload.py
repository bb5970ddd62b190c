"""Load-based refusals with simworkers: least_load answers a retryable 503
no_available_workers when every worker is at --least-load-max-waiting-
requests, and overload protection vetoes workers over their threshold,
with a terminal 503 and Retry-After once every worker is vetoed."""
import re
import threading
import time

import gw
import sim
import util

MODEL = "sim-model"
BODY = {"model": MODEL, "prompt": "the quick brown fox", "max_tokens": 8}
QUICK = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


def busy(worker, n, max_tokens):
    """n concurrent completions straight to a worker (not through the
    gateway); returns the threads to join."""
    def one():
        try:
            util.post(worker.port, "/v1/completions",
                      {"model": MODEL, "prompt": "hello there",
                       "max_tokens": max_tokens}, timeout=30)
        except OSError:
            pass  # the worker stopped first
    ts = [threading.Thread(target=one) for _ in range(n)]
    for t in ts:
        t.start()
    return ts


def reported_waiting(g, url, at_least):
    pat = re.escape(url) + r" via loads: waiting (\d+)"
    vals = [int(v) for v in re.findall(pat, g.log())]
    return bool(vals) and vals[-1] >= at_least


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
