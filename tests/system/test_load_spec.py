"""Per-worker load options of the WorkerSpec (gateway.md §8, §9.1, §12):
load_monitor_interval_secs lowers its group's poll period, and an overload
veto in the spec makes the poller fetch that worker's loads even when
nothing else consumes them."""
import re
import time

import gw
import sim
import util

MODEL = "sim-model"


def reports(g, url):
    return len(re.findall(r"load_report: " + re.escape(url) + r" via \w+: ",
                          g.log()))


def test_spec_interval_lowers_its_groups_period(tmp_path):
    a = sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0")
    b = sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "least_load",
                              "--load-monitor-interval", "60",
                              "--log-level", "debug") as g:
            r = g.post("/workers", {"url": a.url,
                                    "load_monitor_interval_secs": 1})
            assert r.status in (200, 201, 202), r
            r = g.post("/workers", {"url": b.url})
            assert r.status in (200, 201, 202), r
            r = g.post("/workers", {"url": "http://127.0.0.1:1",
                                    "load_monitor_interval_secs": 0})
            assert r.status == 400, r
            assert b"load_monitor_interval_secs" in r.body, r
            g.wait_ready(2)
            time.sleep(0.5)
            ra, rb = reports(g, a.url), reports(g, b.url)
            time.sleep(3.5)
            # Both are one group (model, type, mode): both every second.
            assert reports(g, a.url) - ra >= 3, g.log()[-3000:]
            assert reports(g, b.url) - rb >= 3
            w = [w for w in g.get("/workers").json()["workers"]
                 if w["url"] == a.url][0]
            assert w.get("load_monitor_interval_secs") == 1 or \
                "load_monitor_interval_secs" in str(w), w
            g.stop()
    finally:
        a.stop()
        b.stop()


def test_spec_overload_makes_loads_polled(tmp_path):
    a = sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0")
    b = sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "random",
                              "--disable-load-monitoring",
                              "--load-monitor-interval", "1",
                              "--log-level", "debug") as g:
            util.wait_for(lambda: "load monitoring off" in g.log(),
                          what="the poller's start line")
            r = g.post("/workers", {"url": a.url,
                                    "overload": {"waiting_requests": 4}})
            assert r.status in (200, 201, 202), r
            r = g.post("/workers", {"url": b.url})
            assert r.status in (200, 201, 202), r
            g.wait_ready(2)
            time.sleep(3)
            assert reports(g, a.url) >= 2, g.log()[-3000:]
            assert reports(g, b.url) == 0
            g.stop()
    finally:
        a.stop()
        b.stop()
