"""smg-poller end to end: registration discovery (engine, model, retries,
startup timeout) and health probes driving Ready/NotReady, through the
broker's worker API."""
import re
import time

import gw
import sim
import util

RR = ("--policy", "round_robin")


def workers_by_url(g):
    r = g.get("/workers", timeout=2)
    assert r.status == 200, r
    return {w["url"]: w for w in r.json()["workers"]}


def wait_status(g, url, status, timeout=10.0):
    return util.wait_for(
        lambda: workers_by_url(g).get(url, {}).get("status") == status,
        timeout=timeout, what=f"{url} {status}")


def test_discovery_learns_engine_and_model(tmp_path):
    wv = sim.start_simworker(tmp_path, "--engine", "vllm", "--model", "m1")
    ws = sim.start_simworker(tmp_path, "--engine", "sglang", "--model", "m1")
    try:
        with gw.start_gateway(tmp_path, *RR,
                              "--worker-urls", wv.url, ws.url) as g:
            g.wait_ready(2)
            ws_ = workers_by_url(g)
            assert ws_[wv.url]["model_id"] == "m1"
            assert ws_[wv.url]["runtime_type"] == "vllm"
            assert ws_[ws.url]["model_id"] == "m1"
            assert ws_[ws.url]["runtime_type"] == "sglang"
            assert f"{wv.url}: model m1, runtime vllm" in g.log()
            g.stop()
    finally:
        wv.stop()
        ws.stop()


# The worker's 3 s start delay is over before a gateway under valgrind
# has started, so no 503 is ever seen.
@util.skip_under_valgrind
def test_discovery_waits_for_a_starting_worker(tmp_path):
    w = sim.start_simworker(tmp_path, "--model", "late", "--start-delay",
                            "3", wait_healthy=False)
    try:
        with gw.start_gateway(tmp_path, *RR, "--worker-urls", w.url) as g:
            # Pending while /health answers 503, Ready soon after.
            assert workers_by_url(g)[w.url]["status"] == "Pending"
            g.wait_ready(1, timeout=10)
            assert workers_by_url(g)[w.url]["model_id"] == "late"
            assert f"waiting for {w.url}: GET /health: status 503" \
                in g.log()
            g.stop()
    finally:
        w.stop()


def test_unreachable_worker_fails_after_startup_timeout(tmp_path):
    url = f"http://127.0.0.1:{util.free_port()}"
    with gw.start_gateway(tmp_path, *RR, "--worker-urls", url,
                          "--worker-startup-timeout-secs", "3") as g:
        assert workers_by_url(g)[url]["status"] == "Pending"
        start = time.monotonic()
        wait_status(g, url, "Failed", timeout=10)
        # Tried every second for the 3 s, then gave up.
        assert time.monotonic() - start < 6 * util.TIMEOUT_MULT
        assert re.search(re.escape(url) + r": gave up after \d+ s: "
                         r"GET /health: connect failed", g.log()), g.log()
        g.stop()


def test_health_probes_move_worker(tmp_path):
    w = sim.start_simworker(tmp_path, "--model", "m")
    try:
        with gw.start_gateway(tmp_path, *RR, "--worker-urls", w.url,
                              "--health-check-interval-secs", "1",
                              "--health-check-timeout-secs", "1",
                              "--health-failure-threshold", "2",
                              "--health-success-threshold", "1") as g:
            g.wait_ready(1)
            w.control(healthy=False)
            wait_status(g, w.url, "NotReady", timeout=8)
            assert "/health failed: status 503" in g.log()
            assert g.get("/readiness").status == 503
            w.control(healthy=True)
            wait_status(g, w.url, "Ready", timeout=8)
            g.stop()
    finally:
        w.stop()


def test_disabled_health_checks_still_learn_the_model(tmp_path):
    w = sim.start_simworker(tmp_path, "--model", "quiet")
    try:
        with gw.start_gateway(tmp_path, *RR, "--worker-urls", w.url,
                              "--disable-health-check",
                              "--health-check-interval-secs", "1") as g:
            g.wait_ready(1)
            util.wait_for(
                lambda: workers_by_url(g)[w.url]["model_id"] == "quiet",
                what="model learnt")
            w.control(healthy=False)
            time.sleep(2.5)
            assert workers_by_url(g)[w.url]["status"] == "Ready"
            assert "/health failed" not in g.log()
            g.stop()
    finally:
        w.stop()


def test_https_worker_probed_over_tls(tmp_path):
    # A plain-HTTP worker registered as https://: the TLS handshake fails,
    # so registration never succeeds and the worker ends Failed.
    w = sim.start_simworker(tmp_path, "--model", "m")
    url = f"https://127.0.0.1:{w.port}"
    try:
        with gw.start_gateway(tmp_path, *RR, "--worker-urls", url,
                              "--worker-startup-timeout-secs", "1") as g:
            wait_status(g, url, "Failed", timeout=10)
            assert "GET /health: tls handshake failed" in g.log(), g.log()
            g.stop()
    finally:
        w.stop()
