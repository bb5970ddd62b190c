"""Non-streamed responses are read whole before they are relayed
(gateway.md §4 step 6): a worker that fails mid-body is a failed attempt
(retried, fed to the breaker), never a truncated 200; a body over
--max-payload-size is 502. Streams are relayed as they come.
"""
import http.client
import json

import gw
import sim
import util


def complete(port, body, timeout=20.0):
    """(status, body bytes, complete?) of one POST /v1/completions."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        try:
            data = r.read()
            return r.status, data, True
        except http.client.IncompleteRead as e:
            return r.status, e.partial, False
    finally:
        c.close()


def test_mid_body_failures_never_reach_clients(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0",
                              "--close-rate", "0.3", "--seed", str(i))
          for i in range(2)]
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--retry-initial-backoff-ms", "1",
                          "--disable-circuit-breaker",
                          "--worker-urls", *[w.url for w in ws]) as g:
        g.wait_ready(2)
        truncated = ok = 0
        for i in range(100):
            status, data, whole = complete(
                g.port, {"model": "sim-model", "prompt": f"p{i} " * 50,
                         "max_tokens": 64})
            if not whole:
                truncated += 1
                continue
            if status == 200:
                json.loads(data)  # a whole JSON body
                ok += 1
            else:
                assert "error" in json.loads(data), data
        assert truncated == 0
        # 30 % cut per attempt, five attempts: almost all succeed.
        assert ok >= 95, ok
        assert "smg_worker_retries_total" in g.metrics()
        g.stop()
    for w in ws:
        w.stop()


def test_response_over_max_payload_is_502(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--max-payload-size", "2048",
                          "--worker-urls", w.url) as g:
        g.wait_ready(1)
        status, data, whole = complete(
            g.port, {"model": "sim-model", "prompt": "x", "max_tokens": 2000})
        assert whole
        assert status == 502, data
        err = json.loads(data)["error"]
        assert err["code"] == "upstream_response_too_large"
        # A small one still goes through.
        status, data, whole = complete(
            g.port, {"model": "sim-model", "prompt": "x", "max_tokens": 2})
        assert status == 200 and whole
        g.stop()
    w.stop()
