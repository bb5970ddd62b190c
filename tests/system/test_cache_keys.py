"""Key-aware routing with simworkers: sticky keys (--routing-key-override)
stay on their worker while a new worker joins through POST /workers, body
rids of one conversation share a pin, consistent_hashing keeps a key on
one worker, and prefix_hash co-locates requests sharing a prefix."""
import re

import gw
import sim
import util

MODEL = "sim-model"


def send(g, prompt="hi", key=None, rid=None):
    b = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    if rid:
        b["rid"] = rid
    h = {"x-smg-routing-key": key} if key else None
    r = g.post("/v1/completions", b, headers=h, timeout=30)
    assert r.status == 200, r
    return r.headers["x-smg-routed-worker-id"]


def metric(g, name, label):
    m = re.search(re.escape(name) + r"\{" + re.escape(label) + r"\} (\d+)",
                  g.metrics())
    return int(m.group(1)) if m else 0


def test_sticky_key_stays_while_a_worker_joins(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(3)]
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--routing-key-override",
                              "--worker-urls", ws[0].url, ws[1].url,
                              "--log-level", "debug") as g:
            g.wait_ready(2)
            pins = {f"k{i}": send(g, key=f"k{i}") for i in range(8)}
            assert len(set(pins.values())) == 2, pins
            r = g.post("/workers", {"url": ws[2].url})
            assert r.status == 202, r
            g.wait_ready(3)
            # Unkeyed traffic reaches the newcomer (round robin) ...
            free = {send(g) for _ in range(6)}
            assert ws[2].url in free, free
            # ... while every key stays where it was pinned.
            for _ in range(3):
                for k, u in pins.items():
                    assert send(g, key=k) == u, k
            # Lineage: turns and retries of one conversation share a pin.
            first = send(g, rid="conv7_t1")
            assert send(g, rid="conv7_t2") == first
            assert send(g, rid="conv7_t3_r2") == first
            assert metric(g, "smg_manual_policy_branch_total",
                          'branch="occupied_hit"') >= 26
            assert metric(g, "smg_routing_key_source_total",
                          'source="rid"') == 3
            assert re.search(r"sticky source header key k\d branch "
                             r"occupied_hit worker http://\S+ model ",
                             g.log())
            g.stop()
    finally:
        for w in ws:
            w.stop()


def test_consistent_hashing_and_prefix_hash(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(3)]
    urls = [w.url for w in ws]
    try:
        with gw.start_gateway(tmp_path, "--policy", "consistent_hashing",
                              "--worker-urls", *urls) as g:
            g.wait_ready(3)
            owners = {f"user{i}": send(g, key=f"user{i}") for i in range(12)}
            assert len(set(owners.values())) > 1, owners
            for k, u in owners.items():
                assert send(g, key=k) == u
            r = g.post("/v1/completions",
                       {"model": MODEL, "prompt": "x", "max_tokens": 2},
                       headers={"x-smg-target-worker": "9"})
            assert r.status == 503, r
            assert metric(g, "smg_consistent_hashing_policy_branch_total",
                          'branch="routing_key_hit"') == 24
            # Retried like any 503 no_available_workers: >= 1 decision.
            assert metric(g, "smg_consistent_hashing_policy_branch_total",
                          'branch="target_worker_miss"') >= 1
            g.stop()
        with gw.start_gateway(tmp_path, "--policy", "prefix_hash",
                              "--worker-urls", *urls) as g:
            g.wait_ready(3)
            long_prefix = "shared system prompt " * 100
            seen = {send(g, long_prefix + f" q{i}") for i in range(10)}
            assert len(seen) == 1, seen
            assert metric(g, "smg_prefix_hash_policy_branch_total",
                          'branch="ring_hit"') == 10
            g.stop()
    finally:
        for w in ws:
            w.stop()


def held(g, key, ms):
    """A raw keyed request the worker holds for ms; returns the socket."""
    import json
    import socket
    body = json.dumps({"model": MODEL, "prompt": "hold", "max_tokens": 2,
                       "sim_hold_ms": ms}).encode()
    s = socket.create_connection(("127.0.0.1", g.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nx-smg-routing-key: " +
              key.encode() + b"\r\nContent-Length: " +
              str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def test_sticky_cap_respill_and_exact_inflight(tmp_path):
    import time
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(2)]
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--routing-key-override",
                              "--worker-urls", ws[0].url, ws[1].url) as g:
            g.wait_ready(2)
            pin = send(g, key="hk")
            # Two held on the pin: the third goes elsewhere.
            socks = [held(g, "hk", 1500) for _ in range(2)]
            time.sleep(0.5)
            other = send(g, key="hk")
            assert other != pin
            assert metric(g, "smg_manual_policy_branch_total",
                          'branch="cap_respill"') == 1
            for s in socks:
                assert b" 200 " in s.recv(4096).split(b"\r\n")[0] + b" "
                s.close()
            # Both ended: the key stays on its pin, no respill.
            cur = send(g, key="hk")
            for _ in range(3):
                assert send(g, key="hk") == cur
            assert metric(g, "smg_manual_policy_branch_total",
                          'branch="cap_respill"') == 1
            g.stop()
    finally:
        for w in ws:
            w.stop()
