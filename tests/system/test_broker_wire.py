"""The broker conversation on nng's wire, and prompts too big for it.

A plain libnng REQ socket (smg-nngreq) gets decisions from the running
broker over RUN/broker.ipc, as any SP peer can. Prompts larger than a
broker message travel cut to the routing text limit: they are served,
the broker connection stays up, and the requests after them get policy
decisions, not the local fallback.
"""
import json
import os
import re
import signal
import subprocess
import time

import gw
import sim
import util

MODEL = "sim-model"


def metric(g, name):
    m = re.search(r"^" + re.escape(name) + r"(?:\{\})? (\d+)", g.metrics(),
                  re.M)
    return int(m.group(1)) if m else 0


def nngreq(g, model, *texts):
    url = "ipc://" + os.path.join(g.run_dir, "broker.ipc")
    p = subprocess.run([util.binary("smg-nngreq"), url, model, *texts],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def test_libnng_req_client_gets_decisions(tmp_path):
    w1 = sim.start_simworker(tmp_path, "--time-scale", "0")
    w2 = sim.start_simworker(tmp_path, "--time-scale", "0")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--worker-urls", w1.url, w2.url) as g:
        g.wait_ready(2)
        out = nngreq(g, "", "hello", "world", "again", "more")
        assert len(out) == 4
        assert all(d["status"] == "ok" for d in out), out
        # round_robin over the two workers, in the batch's order.
        urls = [d["worker_url"] for d in out]
        assert set(urls) == {w1.url, w2.url}
        assert urls[0] != urls[1] and urls[0] == urls[2], urls
        # The gateway's own frontends kept their connection meanwhile.
        r = g.post("/generate", {"text": "hi"})
        assert r.status == 200, r
        assert g.get("/readiness").status == 200
        g.stop()
    w1.stop()
    w2.stop()


def test_prompts_over_a_broker_message(tmp_path):
    w1 = sim.start_simworker(tmp_path, "--time-scale", "0",
                             "--context-length", "10000000",
                             "--kv-capacity", "100000000")
    w2 = sim.start_simworker(tmp_path, "--time-scale", "0",
                             "--context-length", "10000000",
                             "--kv-capacity", "100000000")
    with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                          "--worker-urls", w1.url, w2.url) as g:
        g.wait_ready(2)
        big = "x" * (17 * 1000 * 1000)  # over the old 16 MiB message cap
        for i in range(3):
            r = g.post("/v1/chat/completions",
                       {"model": MODEL, "max_tokens": 1,
                        "messages": [{"role": "user",
                                      "content": f"{i} {big}"}]},
                       timeout=120)
            assert r.status == 200, r
        # Cut to fit a broker message: the connection survives them.
        assert metric(g, "smg_broker_routing_text_cut_total") >= 1
        assert "frame over" not in g.log()
        assert "connection to" not in g.log()
        # A slow decision on a huge prompt may time out (local fallback);
        # within a second the broker decides again.
        time.sleep(1.0)
        before = metric(g, "smg_broker_fallback_decisions_total")
        for i in range(20):
            r = g.post("/v1/chat/completions",
                       {"model": MODEL, "max_tokens": 1,
                        "messages": [{"role": "user",
                                      "content": f"small {i}"}]})
            assert r.status == 200, r
        assert metric(g, "smg_broker_fallback_decisions_total") == before
        r = g.get("/readiness")
        assert r.status == 200, r
        g.stop()
    w1.stop()
    w2.stop()


def test_readiness_follows_the_broker(tmp_path):
    w1 = sim.start_simworker(tmp_path, "--time-scale", "0")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--worker-urls", w1.url) as g:
        g.wait_ready(1)
        assert g.get("/readiness").status == 200
        broker = g.pids()["broker"][0]
        os.kill(broker, signal.SIGSTOP)
        try:
            # Served by the local fallback meanwhile, and still ready
            # for a few seconds (a broker restart is not an outage).
            r = g.post("/generate", {"text": "hi"})
            assert r.status == 200, r
            assert g.get("/readiness").status == 200

            def not_ready():
                r = g.get("/readiness", timeout=2)
                return r.status == 503 and \
                    r.json()["reason"] == "broker unreachable"
            util.wait_for(not_ready, timeout=15,
                          what="readiness 503 broker unreachable")
        finally:
            os.kill(broker, signal.SIGCONT)
        util.wait_for(lambda: g.get("/readiness", timeout=2).status == 200,
                      timeout=10, what="readiness back")
        r = g.post("/generate", {"text": "hi"})
        assert r.status == 200, r
        g.stop()
    w1.stop()
