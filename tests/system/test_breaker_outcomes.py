"""SMG's circuit breaker opens on exactly --cb-failure-threshold
back-to-back failures: a failure outcome reaches the broker before the
next decision, whichever frontend makes it (only successes are batched)."""
import gw
import sim


def test_breaker_opens_on_the_configured_failure(tmp_path):
    w = sim.start_simworker(tmp_path, "--model", "sim-model",
                            "--time-scale", 0, "--fail-rate", 1.0,
                            "--fail-status", 500)
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url, "--disable-retries",
                         "--cb-failure-threshold", 3,
                         "--cb-timeout-duration-secs", 1,
                         "--cb-success-threshold", 1, frontends=2)
    try:
        g.wait_ready(1)
        body = {"model": "sim-model", "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]}
        for run in range(5):
            # Back to back, a new connection each (either frontend).
            got = [g.post("/v1/chat/completions", body).status
                   for _ in range(5)]
            assert got == [500, 500, 500, 503, 503], (run, got)
            # Half-open after 1 s; one success would close it, but the
            # probe fails again: wait it out and heal the worker instead.
            w.control(fail_rate=0.0)
            util_wait_closed(g, body)
            w.control(fail_rate=1.0)
    finally:
        g.stop()
        w.stop()


def util_wait_closed(g, body):
    import time

    import util
    deadline = time.monotonic() + 10 * util.TIMEOUT_MULT
    while time.monotonic() < deadline:
        if g.post("/v1/chat/completions", body).status == 200:
            return
        time.sleep(0.2)
    raise AssertionError("breaker never closed again")
