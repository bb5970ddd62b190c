"""Availability with simworkers: the circuit breaker removes a worker that
fails every request and lets it back after half-open successes, a flood
of 4xx never opens it, and a worker whose health endpoint fails leaves
the candidate set and returns; with their metrics."""
import collections
import re
import time

import gw
import sim
import util

MODEL = "sim-model"
QUICK = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


def send(g, n):
    """n sequential requests; returns Counter of (status, worker)."""
    seen = collections.Counter()
    for _ in range(n):
        r = g.post("/v1/completions", QUICK, timeout=10)
        seen[(r.status, r.headers.get("x-smg-routed-worker-id"))] += 1
    return seen


def metric(g, family, labels):
    m = re.search(re.escape(family + "{" + labels + "}") + r" (-?\d+)",
                  g.metrics())
    return int(m.group(1)) if m else None


def workers_by_url(g):
    r = g.get("/workers", timeout=2)
    assert r.status == 200, r
    return {w["url"]: w for w in r.json()["workers"]}


def test_breaker_opens_and_recovers(tmp_path):
    w1 = sim.start_simworker(tmp_path)
    w2 = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "least_load",
                              "--worker-urls", w1.url, w2.url,
                              "--load-monitor-interval", "1",
                              "--cb-failure-threshold", "3",
                              "--cb-success-threshold", "2",
                              "--cb-timeout-duration-secs", "1",
                              "--disable-retries") as g:
            g.wait_ready(2)
            w1.control(fail_rate=1.0)
            seen = send(g, 20)
            # Three 500s from w1, then it is out: w2 serves the rest.
            assert seen[(500, w1.url)] == 3, seen
            assert seen[(200, w2.url)] == 17, seen
            lab = f'worker="{w1.url}"'
            assert metric(g, "smg_worker_cb_state", lab) == 1
            assert metric(g, "smg_worker_cb_transitions_total",
                          lab + ',from="closed",to="open"') == 1
            assert metric(g, "smg_worker_cb_outcomes_total",
                          lab + ',outcome="failure"') == 3
            assert workers_by_url(g)[w1.url]["circuit_breaker_state"] == \
                "open"
            # Healthy again; after the 1 s timeout it is half-open, takes
            # traffic, and two successes close it.
            w1.control(fail_rate=0.0)
            time.sleep(1.2)
            deadline = time.monotonic() + 10 * util.TIMEOUT_MULT
            while metric(g, "smg_worker_cb_state", lab) != 0:
                assert time.monotonic() < deadline, g.log()[-2000:]
                assert g.post("/v1/completions", QUICK).status == 200
            for frm, to in (("open", "half_open"), ("half_open", "closed")):
                assert metric(g, "smg_worker_cb_transitions_total",
                              f'{lab},from="{frm}",to="{to}"') == 1
            seen = send(g, 20)
            assert seen[(200, w1.url)] >= 3, seen
            g.stop()
    finally:
        w1.stop()
        w2.stop()


def test_4xx_flood_never_opens_the_breaker(tmp_path):
    w1 = sim.start_simworker(tmp_path)
    w2 = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w1.url, w2.url,
                              "--cb-failure-threshold", "2",
                              "--disable-retries") as g:
            g.wait_ready(2)
            w1.control(fail_rate=1.0, status=400)
            seen = send(g, 40)
            assert seen[(400, w1.url)] == 20, seen
            assert seen[(200, w2.url)] == 20, seen
            lab = f'worker="{w1.url}"'
            assert metric(g, "smg_worker_cb_state", lab) == 0
            assert metric(g, "smg_worker_cb_outcomes_total",
                          lab + ',outcome="success"') == 20
            assert "smg_worker_cb_transitions_total" not in g.metrics()
            # 429 is neither: ignored by the breaker.
            w1.control(fail_rate=1.0, status=429)
            seen = send(g, 10)
            assert seen[(429, w1.url)] == 5, seen
            assert metric(g, "smg_worker_cb_state", lab) == 0
            g.stop()
    finally:
        w1.stop()
        w2.stop()


def test_unhealthy_worker_leaves_and_returns(tmp_path):
    w1 = sim.start_simworker(tmp_path)
    w2 = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "least_load",
                              "--worker-urls", w1.url, w2.url,
                              "--load-monitor-interval", "1",
                              "--health-check-interval-secs", "1",
                              "--health-check-timeout-secs", "1",
                              "--health-failure-threshold", "2",
                              "--health-success-threshold", "1") as g:
            g.wait_ready(2)
            lab = f'worker="{w1.url}"'
            assert metric(g, "smg_worker_health", lab) == 1
            assert re.search(r'smg_worker_pool_size\{worker_type="regular",'
                             r'connection_mode="http",model="sim-model"\} 2',
                             g.metrics()), g.metrics()
            w1.control(healthy=False)
            util.wait_for(
                lambda: workers_by_url(g)[w1.url]["status"] == "NotReady",
                timeout=8, what="w1 NotReady")
            assert metric(g, "smg_worker_health", lab) == 0
            assert metric(g, "smg_worker_health_checks_total",
                          'worker_type="regular",result="failure"') >= 2
            seen = send(g, 10)
            assert seen[(200, w2.url)] == 10, seen
            w1.control(healthy=True)
            util.wait_for(
                lambda: workers_by_url(g)[w1.url]["status"] == "Ready",
                timeout=8, what="w1 Ready again")
            assert metric(g, "smg_worker_health", lab) == 1
            seen = send(g, 30)
            assert seen[(200, w1.url)] >= 3, seen
            g.stop()
    finally:
        w1.stop()
        w2.stop()


def test_dead_worker_detected_within_threshold_and_warned(tmp_path):
    """A worker process that dies is NotReady within
    --health-check-interval-secs x --health-failure-threshold (plus one
    probe timeout), and the broker says so at warn level."""
    interval, threshold = 1, 3
    w1 = sim.start_simworker(tmp_path)
    w2 = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w1.url, w2.url,
                              "--health-check-interval-secs", str(interval),
                              "--health-check-timeout-secs", "1",
                              "--health-failure-threshold", str(threshold),
                              "--disable-circuit-breaker") as g:
            g.wait_ready(2)
            w1.stop()
            t0 = time.monotonic()
            util.wait_for(
                lambda: workers_by_url(g)[w1.url]["status"] == "NotReady",
                timeout=interval * threshold + 5, what="w1 NotReady")
            took = time.monotonic() - t0
            # One probe timeout of slack on top of the threshold.
            assert took <= interval * threshold + 1.5, took
            warn = [ln for ln in g.log().splitlines()
                    if w1.url in ln and "NotReady" in ln]
            assert warn, g.log()[-3000:]
            assert any("warn" in ln.lower() for ln in warn), warn
            seen = send(g, 6)
            assert seen[(200, w2.url)] == 6, seen
            g.stop()
    finally:
        w1.stop()
        w2.stop()
