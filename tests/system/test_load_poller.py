"""Load polling end to end: /v1/loads reports, the Prometheus /metrics
fallback for workers without that route (SGLang and vLLM names), the
--engine-metrics gauges they feed, and --disable-load-monitoring."""
import re
import threading

import gw
import sim
import util

MODEL = "sim-model"


def busy(worker, n, max_tokens):
    """n concurrent completions sent straight to a worker (not through
    the gateway), so its queue fills; returns the threads to join."""
    def one():
        util.post(worker.port, "/v1/completions",
                  {"model": MODEL, "prompt": "hello there",
                   "max_tokens": max_tokens}, timeout=30)
    ts = [threading.Thread(target=one) for _ in range(n)]
    for t in ts:
        t.start()
    return ts


def gauge(g, family, url):
    m = re.search(re.escape(family) + r'\{worker="' + re.escape(url) +
                  r'",model="[^"]*",dp_rank="0"\} (-?[\d.]+)', g.metrics())
    return float(m.group(1)) if m else None


def test_loads_and_metrics_fallback(tmp_path):
    slow = ("--max-running", "1", "--decode-base-ms", "100")
    ws = sim.start_simworker(tmp_path, "--engine", "sglang", "--no-loads",
                             *slow)
    wv = sim.start_simworker(tmp_path, "--engine", "vllm", "--no-loads",
                             *slow)
    wl = sim.start_simworker(tmp_path, "--engine", "sglang", *slow)
    threads = []
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", ws.url, wv.url, wl.url,
                              "--load-monitor-interval", "1",
                              "--engine-metrics",
                              "--log-level", "debug") as g:
            g.wait_ready(3)
            # 1 running + 2 waiting on each worker for about 3 s.
            for w in (ws, wv, wl):
                threads += busy(w, 3, 30)
            for w in (ws, wv, wl):
                util.wait_for(
                    lambda w=w: (gauge(g, "smg_engine_waiting_requests",
                                       w.url) or 0) >= 1,
                    timeout=8, what=f"{w.url} waiting gauge")
                assert gauge(g, "smg_engine_running_requests", w.url) >= 1
                # Ratios keep their decimals (KV usage of a busy worker).
                usage = gauge(g, "smg_engine_token_usage", w.url)
                assert usage is not None and 0 < usage < 1, usage
            log = g.log()
            for w in (ws, wv):
                assert f"{w.url}: /v1/loads absent (status 404); using " \
                    "/metrics" in log, log[-3000:]
                assert re.search(re.escape(w.url) + r" via metrics: "
                                 r"waiting [12], running 1", log), \
                    log[-3000:]
            assert re.search(re.escape(wl.url) + r" via loads: waiting [12]"
                             r", running 1", log), log[-3000:]
            assert f"{wl.url}: /v1/loads absent" not in log
            # The absent route is remembered: found once per worker.
            assert log.count(f"{ws.url}: /v1/loads absent") == 1
            for t in threads:
                t.join(30)
            threads = []
            # Queues drained: the gauges follow.
            util.wait_for(
                lambda: gauge(g, "smg_engine_waiting_requests",
                              ws.url) == 0 and
                gauge(g, "smg_engine_running_requests", wv.url) == 0,
                timeout=8, what="gauges back to 0")
            g.stop()
    finally:
        for t in threads:
            t.join(30)
        for w in (ws, wv, wl):
            w.stop()


def test_monitoring_off_when_nothing_consumes_loads(tmp_path):
    w = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url,
                              "--load-monitor-interval", "1",
                              "--disable-load-monitoring",
                              "--log-level", "debug") as g:
            g.wait_ready(1)
            assert "load monitoring off" in g.log()
            r = g.post("/v1/completions", {"model": MODEL, "prompt": "x",
                                           "max_tokens": 2})
            assert r.status == 200, r
            assert " via loads" not in g.log()
            g.stop()
    finally:
        w.stop()
    # A load-aware policy turns it back on.
    tmp_b = tmp_path / "b"
    tmp_b.mkdir()
    w = sim.start_simworker(tmp_b)
    try:
        with gw.start_gateway(tmp_b, "--policy", "least_load",
                              "--worker-urls", w.url,
                              "--load-monitor-interval", "1",
                              "--disable-load-monitoring",
                              "--log-level", "debug") as g:
            g.wait_ready(1)
            util.wait_for(lambda: f"{w.url} via loads" in g.log(),
                          timeout=6, what="a load report")
            g.stop()
    finally:
        w.stop()
