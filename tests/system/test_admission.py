"""SMG's admission control (gateway.md §2.6, §5): --max-concurrent-requests
caps the requests in progress across every frontend, --queue-size of them
wait in FIFO order for at most --queue-timeout-secs, the rest are refused
429 admission_queue_full; a wait past the timeout answers 503
admission_queue_timeout; --rate-limit-tokens-per-second meters admissions."""
import threading
import time

import gw
import sim
import util


def chat(max_tokens):
    return {"model": "sim-model", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello there"}]}


def fire(g, n, max_tokens, stagger=0.0):
    """n concurrent requests (one connection each); results in start
    order: (status, error code or None, seconds)."""
    out = [None] * n

    def one(i):
        t0 = time.monotonic()
        r = g.post("/v1/chat/completions", chat(max_tokens), timeout=30)
        code = None
        if r.status != 200:
            code = r.json()["error"]["code"]
        out[i] = (r.status, code, time.monotonic() - t0)

    threads = []
    for i in range(n):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
        if stagger:
            time.sleep(stagger)
    for t in threads:
        t.join(60 * util.TIMEOUT_MULT)
    return out


def slow_worker(tmp_path, step_ms):
    # Each output token takes step_ms: max_tokens sets the duration.
    return sim.start_simworker(tmp_path, "--model", "sim-model",
                               "--decode-base-ms", step_ms,
                               "--decode-per-req-ms", 0,
                               "--max-running", 64)


def test_cap_queue_and_refusals(tmp_path):
    w = slow_worker(tmp_path, 50)
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url,
                         "--max-concurrent-requests", 2, "--queue-size", 2,
                         "--queue-timeout-secs", 3)
    try:
        g.wait_ready(1)
        # ~0.8 s each: two run, two wait then run, two are refused.
        res = fire(g, 6, 16, stagger=0.05)
        statuses = sorted(r[0] for r in res)
        assert statuses == [200, 200, 200, 200, 429, 429], res
        assert [r[1] for r in res if r[0] == 429] == \
            ["admission_queue_full"] * 2
        # FIFO: the first two ran at once, the next two waited for them.
        fast = sorted(r[2] for r in res if r[0] == 200)
        assert fast[2] > fast[0] + 0.5, res
        assert w.stats()["requests"] >= 4
        m = g.metrics()
        assert 'smg_http_rate_limit_total{result="rejected"} 2' in m, m
    finally:
        g.stop()
        w.stop()


def test_queue_timeout_answers_503(tmp_path):
    w = slow_worker(tmp_path, 100)
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url,
                         "--max-concurrent-requests", 2, "--queue-size", 2,
                         "--queue-timeout-secs", 1)
    try:
        g.wait_ready(1)
        # ~3 s each: the two queued give up after 1 s.
        res = fire(g, 4, 30, stagger=0.05)
        by = sorted((r[0], r[1]) for r in res)
        assert by == [(200, None), (200, None),
                      (503, "admission_queue_timeout"),
                      (503, "admission_queue_timeout")], res
        for status, _, secs in res:
            if status == 503:
                assert 0.9 <= secs < 2.5, res
    finally:
        g.stop()
        w.stop()


def test_cap_holds_across_frontends(tmp_path):
    w = slow_worker(tmp_path, 50)
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url, "--max-concurrent-requests",
                         2, "--queue-size", 0, frontends=2)
    try:
        g.wait_ready(1)
        w.reset_stats()
        res = fire(g, 8, 20)
        statuses = sorted(r[0] for r in res)
        assert statuses == [200] * 2 + [429] * 6, res
        # Each frontend refused or served some: the cap is gateway-wide.
        assert w.stats()["requests"] == 2
    finally:
        g.stop()
        w.stop()


def test_rate_limit_meters_admissions(tmp_path):
    w = sim.start_simworker(tmp_path, "--model", "sim-model",
                            "--time-scale", 0)
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url,
                         "--max-concurrent-requests", 2, "--queue-size", 10,
                         "--queue-timeout-secs", 10,
                         "--rate-limit-tokens-per-second", 4)
    try:
        g.wait_ready(1)
        t0 = time.monotonic()
        for _ in range(10):
            r = g.post("/v1/chat/completions", chat(4))
            assert r.status == 200, r
        took = time.monotonic() - t0
        # A burst of 2, then 4 per second: 8 more need about 2 s.
        assert took >= 1.6, took
    finally:
        g.stop()
        w.stop()
