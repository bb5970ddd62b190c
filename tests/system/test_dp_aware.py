"""--dp-aware (gateway.md §1, §12): an engine reporting data-parallel size
N > 1 in its server info becomes N routable workers "<url>@0" ..
"<url>@<N-1>", each request to one of them goes to the engine's own URL
with "data_parallel_rank" set in its body (counted by the simulated worker
per rank), and removing the engine's URL removes every rank. Without
--dp-aware the same engine is one worker and no request carries a rank.
"""
import time
import urllib.parse

import gw
import sim
import util

BODY = {"text": "the quick brown fox", "sampling_params":
        {"max_new_tokens": 2}}


def _workers(g):
    r = g.get("/workers")
    assert r.status == 200, r
    return r.json()["workers"]


def test_dp_aware_expands_ranks(tmp_path):
    w = sim.start_simworker(tmp_path, "--dp-size", 2, "--time-scale", 0)
    try:
        with gw.start_gateway(tmp_path, "--dp-aware", "--policy",
                              "round_robin", "--worker-urls",
                              w.url) as g:
            g.wait_ready(2)
            ws = sorted(_workers(g), key=lambda x: x["url"])
            assert [x["url"] for x in ws] == [w.url + "@0", w.url + "@1"]
            for rank, x in enumerate(ws):
                assert x["status"] == "Ready", x
                assert x["dp_rank"] == rank, x
                assert x["dp_size"] == 2, x
                assert x["dp_base_url"] == w.url, x
            assert ws[0]["id"] != ws[1]["id"]

            w.reset_stats()
            routed = []
            for _ in range(8):
                r = g.post("/generate", BODY)
                assert r.status == 200, r
                routed.append(r.headers["x-smg-routed-worker-id"])
            # round_robin alternates the two ranks.
            assert set(routed) == {w.url + "@0", w.url + "@1"}, routed
            assert all(a != b for a, b in zip(routed, routed[1:])), routed
            dp = w.stats()["dp"]
            # Every request reached the engine with its rank, 4 each.
            assert dp["by_rank"] == [4, 4], dp
            assert dp["without_rank"] == 0, dp
            last = int(routed[-1].rsplit("@", 1)[1])
            assert dp["last_rank"] == last, (dp, routed)

            # A client's own data_parallel_rank is replaced by the rank
            # of the worker chosen.
            r = g.post("/generate", dict(BODY, data_parallel_rank=7))
            assert r.status == 200, r
            rank = int(r.headers["x-smg-routed-worker-id"].rsplit("@")[1])
            assert w.stats()["dp"]["last_rank"] == rank

            # The engine's URL names all its ranks: removing it removes
            # both workers.
            r = g.request("DELETE", "/workers?url=" +
                          urllib.parse.quote(w.url, safe=""))
            assert r.status == 202, r
            assert len(r.json()["worker_ids"]) == 2, r.json()
            util.wait_for(lambda: _workers(g) == [], timeout=30,
                          what="both ranks removed")
    finally:
        w.stop()


def test_dp_aware_probes_the_engine_once(tmp_path):
    """Health probes and load polls of the ranks go to the engine once."""
    w = sim.start_simworker(tmp_path, "--dp-size", 3, "--time-scale", 0)
    try:
        with gw.start_gateway(tmp_path, "--dp-aware", "--policy",
                              "least_load", "--health-check-interval-secs",
                              1, "--load-monitor-interval", 1,
                              "--worker-urls", w.url) as g:
            g.wait_ready(3)
            assert len(_workers(g)) == 3
            # Rank 0 leads; the others never probe their shared engine.
            before, t0 = w.stats()["probes"], time.monotonic()
            time.sleep(6)
            after, t1 = w.stats()["probes"], time.monotonic()
            secs = t1 - t0
            health = after["health"] - before["health"]
            loads = after["loads"] - before["loads"]
            # One engine probed every second: about secs of each; three
            # ranks probing on their own would be three times that.
            assert 1 <= health <= secs + 2, (health, secs)
            assert 1 <= loads <= secs + 2, (loads, secs)
            for _ in range(6):
                r = g.post("/generate", BODY)
                assert r.status == 200, r
            assert sum(w.stats()["dp"]["by_rank"]) == 6
    finally:
        w.stop()


def test_without_dp_aware_one_worker(tmp_path):
    w = sim.start_simworker(tmp_path, "--dp-size", 2, "--time-scale", 0)
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            ws = _workers(g)
            assert [x["url"] for x in ws] == [w.url], ws
            assert "dp_rank" not in ws[0]
            w.reset_stats()
            for _ in range(4):
                r = g.post("/generate", BODY)
                assert r.status == 200, r
                assert r.headers["x-smg-routed-worker-id"] == w.url
            dp = w.stats()["dp"]
            assert dp["by_rank"] == [0, 0], dp
            assert dp["without_rank"] == 4, dp
    finally:
        w.stop()


def test_explicit_rank_urls(tmp_path):
    """"<url>@<rank>" on the command line is that rank, never expanded;
    malformed suffixes are refused with a clear error."""
    w = sim.start_simworker(tmp_path, "--dp-size", 2, "--time-scale", 0)
    try:
        with gw.start_gateway(tmp_path, "--dp-aware", "--policy",
                              "round_robin", "--worker-urls",
                              w.url + "@1") as g:
            g.wait_ready(1)
            ws = _workers(g)
            assert [x["url"] for x in ws] == [w.url + "@1"], ws
            assert ws[0]["dp_rank"] == 1
            # A named rank learns its engine's size from the probe.
            util.wait_for(lambda: _workers(g)[0]["dp_size"] == 2,
                          what="dp_size of a named rank")
            w.reset_stats()
            r = g.post("/generate", BODY)
            assert r.status == 200, r
            assert w.stats()["dp"]["by_rank"] == [0, 1]
            for bad in ("@", "@-1", "@99999999999", "@x", "@07"):
                r = g.post("/workers", {"url": w.url + bad})
                assert r.status == 400, (bad, r)
                assert "user information" in r.json()["error"], \
                    (bad, r.json())
    finally:
        w.stop()
