"""cache_aware event mode: two simworkers publish KV-cache events over ZMQ
(one in SGLang's array form, found through /get_server_info's
kv_events_config; one in vLLM's map form, named by the worker label
kv_events_endpoint). The poller subscribes, the broker keeps the block
index, and /generate requests carrying input_ids go where the engines'
real caches overlap them (event_match). After /flush_cache on the warm
worker (AllBlocksCleared) the index forgets its blocks (event_no_overlap).
"""
import re
import time

import gw
import sim
import util

MODEL = "sim-model"
PAGE = 16
PREFIX_A = list(range(1000, 1000 + 16 * PAGE))    # 16 full blocks
PREFIX_B = list(range(50000, 50000 + 8 * PAGE))   # 8 full blocks


def gen(ids, **kw):
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 2},
            **kw}


def metric(g, name, **labels):
    pat = re.escape(name) + r"\{([^}]*)\} (\d+)"
    total = 0
    for lab, val in re.findall(pat, g.metrics()):
        if all(f'{k}="{v}"' in lab for k, v in labels.items()):
            total += int(val)
    return total


def held_blocks(g, url):
    """Blocks of MODEL in the broker's index after the last batch of
    worker url, from the debug log; None before any."""
    found = re.findall(r"kvindex_handle: " + re.escape(url)
                       + r": batch \d+[^,]*, \d+ events; model \S+ holds "
                       r"(\d+) blocks", g.log())
    return int(found[-1]) if found else None


def warm(g, w, ids, want):
    """Sends ids straight to worker w until the index has seen w's
    blocks (a fresh ZMQ subscription may miss the first batches)."""
    for _ in range(5):
        r = util.post(w.port, "/flush_cache", {})
        assert r.status == 200, r
        r = util.post(w.port, "/generate", gen(ids))
        assert r.status == 200, r
        try:
            util.wait_for(lambda: (held_blocks(g, w.url) or 0) >= want,
                          timeout=2.0, what=f"index holds {w.url}")
            return
        except Exception:
            continue
    raise AssertionError(f"{w.url}: blocks never reached the index")


def test_kv_events_drive_routing(tmp_path):
    pa, pb = util.free_port(), util.free_port()
    a = sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0",
                            "--kv-events-endpoint", f"tcp://127.0.0.1:{pa}",
                            "--kv-events-format", "array")
    b = sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0",
                            "--engine", "vllm",
                            "--kv-events-endpoint", f"tcp://127.0.0.1:{pb}",
                            "--kv-events-format", "map")
    try:
        # SGLang exposes its --kv-events-config in its server info.
        info = util.get(a.port, "/get_server_info").json()
        assert f"tcp://127.0.0.1:{pa}" in info["kv_events_config"]
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--worker-urls", a.url,
                              "--log-level", "debug") as g:
            r = g.post("/workers", {
                "url": b.url,
                "labels": {"kv_events_endpoint": f"tcp://127.0.0.1:{pb}"}})
            assert r.status in (200, 201, 202), r
            g.wait_ready(2)
            util.wait_for(lambda: len(re.findall(
                r"subscribed to KV events on tcp://127\.0\.0\.1:(?:%d|%d)"
                % (pa, pb), g.log())) >= 2, what="both subscriptions")

            # A's engine caches PREFIX_A, B's caches PREFIX_B.
            warm(g, a, PREFIX_A, 16)
            warm(g, b, PREFIX_B, 16 + 8)

            # Requests sharing PREFIX_A go to A; PREFIX_B ones to B.
            for i in range(6):
                r = g.post("/generate", gen(PREFIX_A + [7, 8, i] * 20))
                assert r.status == 200, r
                assert r.headers["x-smg-routed-worker-id"] == a.url, i
                r = g.post("/generate", gen(PREFIX_B + [9, i] * 9))
                assert r.status == 200, r
                assert r.headers["x-smg-routed-worker-id"] == b.url, i
            assert metric(g, "smg_cache_aware_policy_branch_total",
                          branch="event_match") == 12
            # The same through the routing-tokens header (text body).
            r = g.post("/v1/completions",
                       {"model": MODEL, "prompt": "hello", "max_tokens": 2},
                       headers={"x-smg-routing-tokens":
                                ",".join(map(str, PREFIX_B))})
            assert r.status == 200, r
            assert r.headers["x-smg-routed-worker-id"] == b.url
            assert metric(g, "smg_cache_aware_policy_branch_total",
                          branch="event_match") == 13

            # A flushes its cache: AllBlocksCleared empties its entries.
            before = metric(g, "smg_cache_aware_policy_branch_total",
                            branch="event_no_overlap")
            one_event = (r"kvindex_handle: " + re.escape(a.url)
                         + r": batch \d+, 1 events; model \S+ holds "
                         r"(\d+) blocks")
            seen = len(re.findall(one_event, g.log()))
            r = util.post(a.port, "/flush_cache", {})
            assert r.status == 200, r
            util.wait_for(lambda: len(re.findall(one_event, g.log())) > seen,
                          what="A's clear reaching the index")
            # Only B's remain: PREFIX_B's 8 blocks and the 9th block of
            # each of its 6 requests.
            assert int(re.findall(one_event, g.log())[-1]) == 8 + 6
            r = g.post("/generate", gen(PREFIX_A + [1, 2, 3]))
            assert r.status == 200, r
            assert metric(g, "smg_cache_aware_policy_branch_total",
                          branch="event_no_overlap") == before + 1
            # B's blocks are still there.
            r = g.post("/generate", gen(PREFIX_B + [4, 5]))
            assert r.headers["x-smg-routed-worker-id"] == b.url
            g.stop()
    finally:
        a.stop()
        b.stop()


def test_malformed_kv_events_do_not_hurt(tmp_path):
    """A publisher sending garbage, short messages and sequence gaps: the
    poller logs and keeps serving; the gateway keeps routing."""
    import zmq

    port = util.free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    w = sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--log-level", "debug") as g:
            r = g.post("/workers", {
                "url": w.url, "labels": {"kv_events_endpoint": "nowhere"}})
            assert r.status == 400, r
            assert b"kv_events_endpoint" in r.body, r
            r = g.post("/workers", {
                "url": w.url,
                "labels": {"kv_events_endpoint": f"tcp://127.0.0.1:{port}"}})
            assert r.status in (200, 201, 202), r
            g.wait_ready(1)
            util.wait_for(lambda: "subscribed to KV events" in g.log(),
                          what="subscription")
            deadline = time.monotonic() + 10
            while "does not decode" not in g.log():
                assert time.monotonic() < deadline, "no decode warning"
                pub.send_multipart([b"", (0).to_bytes(8, "big"),
                                    b"\xc1\xc1 not msgpack"])
                pub.send_multipart([b"only-two", b"frames"])
                pub.send_multipart([b"", b"short", b"\x90"])
                pub.send_multipart([b"", (9).to_bytes(8, "big"),
                                    b"\x92\xcb" + b"\0" * 8 + b"\x91\x05"])
                time.sleep(0.2)
            r = g.post("/generate", gen(PREFIX_A))
            assert r.status == 200, r
            g.stop()
    finally:
        w.stop()
        pub.close(0)
        ctx.term()
