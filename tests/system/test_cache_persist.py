"""Routing state survives restarts: a manual pin survives a restart of the
whole service, and after kill -9 of the broker under load (the launcher
restarts it) the prefixes and sticky keys seen before route where they
went before, without a single failed client request."""
import os
import signal
import threading
import time

import gw
import sim
import util

MODEL = "sim-model"


def routed(g, prompt, key=None):
    h = {"x-smg-routing-key": key} if key else None
    r = g.post("/v1/completions",
               {"model": MODEL, "prompt": prompt, "max_tokens": 2},
               headers=h, timeout=30)
    assert r.status == 200, r
    return r.headers["x-smg-routed-worker-id"]


def test_manual_pin_survives_service_restart(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(3)]
    args = ["--policy", "manual", "--worker-urls", *[w.url for w in ws]]
    try:
        with gw.start_gateway(tmp_path, *args) as g:
            g.wait_ready(3)
            before = {f"user-{i}": routed(g, "hello", f"user-{i}")
                      for i in range(12)}
            assert len(set(before.values())) > 1, before
            for k, u in before.items():
                assert routed(g, "again", k) == u
            g.stop()
        with gw.start_gateway(tmp_path, *args) as g:
            g.wait_ready(3)
            after = {k: routed(g, "after restart", k) for k in before}
            assert after == before
            assert "assignments" in g.log()
            g.stop()
    finally:
        for w in ws:
            w.stop()


def prefix(i):
    return f"Conversation {i} starts with its own long system text. " * 40


def test_kill9_broker_under_load_keeps_prefixes_and_keys(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(3)]
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--routing-key-override",
                              "--worker-urls", *[w.url for w in ws]) as g:
            g.wait_ready(3)
            prefixes = {i: routed(g, prefix(i) + "first turn")
                        for i in range(8)}
            keys = {f"session-{i}": routed(g, f"key text {i}",
                                           f"session-{i}")
                    for i in range(8)}
            assert len(set(prefixes.values())) > 1, prefixes
            # Past the write-behind window (50 ms) before the crash.
            time.sleep(0.3)

            failures, done = [], threading.Event()
            sent = [0]

            def load():
                i = 0
                while not done.is_set() and i < 5000:
                    r = g.post("/v1/completions",
                               {"model": MODEL, "max_tokens": 2,
                                "prompt": f"background {i % 7} " * 20},
                               timeout=30)
                    if r.status != 200:
                        failures.append(r)
                    i += 1
                    sent[0] = i
            t = threading.Thread(target=load)
            t.start()
            try:
                time.sleep(0.5)
                old = g.pids()["broker"]
                assert len(old) == 1
                os.kill(old[0], signal.SIGKILL)
                util.wait_for(lambda: g.pids()["broker"] and
                              g.pids()["broker"] != old, timeout=15,
                              what="broker restarted")
                time.sleep(1.0)
            finally:
                done.set()
                t.join(30)
            assert sent[0] > 20
            assert not failures, failures[:3]
            # The restarted broker answers from the restored state.
            util.wait_for(lambda: "tree inserts replayed" in g.log(),
                          what="restore log line")
            for i, u in prefixes.items():
                assert routed(g, prefix(i) + "second turn") == u, i
            for k, u in keys.items():
                assert routed(g, f"other text for {k}", k) == u, k
            g.stop()
    finally:
        for w in ws:
            w.stop()
