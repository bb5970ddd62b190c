"""The data path end to end: launcher, broker, poller, frontend, simworkers.

Round robin spreads exactly evenly, streams are relayed chunk by chunk, a
client that goes away frees its in-flight count, failed workers are
retried, and malformed or random input never takes the frontend down.
"""
import http.client
import json
import random
import re
import socket
import time

import gw
import sim
import util

GEN = {"text": "hello there", "sampling_params": {"max_new_tokens": 2}}


def active_total(g):
    total = 0
    for line in g.metrics().splitlines():
        m = re.match(r'smg_worker_requests_active\{[^}]*\} (\d+)', line)
        if m:
            total += int(m.group(1))
    return total


def raw(port, data, timeout=2.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                d = s.recv(65536)
            except socket.timeout:
                break
            if not d:
                break
            out += d
        return out
    finally:
        s.close()


def test_round_robin_exactly_even(tmp_path):
    w1 = sim.start_simworker(tmp_path, "--time-scale", "0")
    w2 = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w1.url, w2.url) as g:
            g.wait_ready(2)
            counts = {}
            conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=10)
            body = json.dumps(GEN)
            for _ in range(1000):
                conn.request("POST", "/generate", body=body,
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                assert r.status == 200
                assert r.getheader("x-request-id", "").startswith("gnt-")
                url = r.getheader("x-smg-routed-worker-id")
                counts[url] = counts.get(url, 0) + 1
            conn.close()
            assert counts == {w1.url: 500, w2.url: 500}
            m = g.metrics()
            assert 'policy="round_robin"} 1000' in m
            assert re.search(r'smg_router_requests_total\{router_type="http",'
                             r'backend_type="regular",[^}]*endpoint="generate",'
                             r'streaming="false"\} 1000', m), m
            assert re.search(r'smg_router_request_duration_seconds_count\{'
                             r'[^}]*endpoint="generate"\} 1000', m), m
            g.stop()
    finally:
        w1.stop()
        w2.stop()


def test_stream_chunks_and_disconnect(tmp_path):
    w = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            body = json.dumps({"text": "hi", "stream": True,
                               "sampling_params": {"max_new_tokens": 24}})
            conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=10)
            conn.request("POST", "/generate", body=body)
            r = conn.getresponse()
            assert r.status == 200
            assert r.getheader("content-type") == "text/event-stream"
            assert r.getheader("x-smg-routed-worker-id") == w.url
            t0 = time.monotonic()
            times = []
            while True:
                line = r.fp.readline()
                if not line:
                    break
                if line.startswith(b"data:"):
                    times.append(time.monotonic() - t0)
                    if b"[DONE]" in line:
                        break
            conn.close()
            assert len(times) >= 20
            assert times[-1] - times[0] > 0.05  # spread out, not one blob

            # A client that leaves mid-stream frees the in-flight count.
            body = json.dumps({"text": "hi", "stream": True,
                               "sampling_params": {"max_new_tokens": 2000}})
            s = socket.create_connection(("127.0.0.1", g.port), timeout=5)
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body),
                                                          body.encode()))
            assert s.recv(100).startswith(b"HTTP/1.1 200")
            util.wait_for(lambda: active_total(g) == 1, timeout=3,
                          what="one request in flight")
            s.close()
            t = time.monotonic()
            util.wait_for(lambda: active_total(g) == 0, timeout=3,
                          what="in-flight back to zero")
            assert time.monotonic() - t < 1.0 * util.TIMEOUT_MULT
            g.stop()
    finally:
        w.stop()


def test_retry_on_dead_worker(tmp_path):
    w1 = sim.start_simworker(tmp_path, "--time-scale", "0")
    w2 = sim.start_simworker(tmp_path, "--time-scale", "0")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--retry-initial-backoff-ms", "1",
                          "--worker-urls", w1.url, w2.url) as g:
        g.wait_ready(2)
        w2.proc.kill()
        for _ in range(20):
            r = g.post("/generate", GEN)
            assert r.status == 200, r
            assert r.headers["x-smg-routed-worker-id"] == w1.url
        assert "smg_worker_retries_total" in g.metrics()
        # The last worker down too: the spec's error JSON.
        w1.proc.kill()
        r = g.post("/v1/completions", {"model": "sim-model", "prompt": "x"})
        assert r.status in (500, 503), r
        err = r.json()["error"]
        assert err["code"] == r.headers["x-smg-error-code"]
        assert err["code"] in ("call_upstream_connection_failed",
                               "no_available_workers")
        assert r.headers["x-request-id"].startswith("cmpl-")
        g.stop()


def test_bad_input_keeps_serving(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            r = g.post("/v1/chat/completions", "{not json")
            assert r.status == 400
            assert r.json()["error"]["code"] == r.headers["x-smg-error-code"]
            r = g.get("/no/such/route")
            assert r.status == 404 and "error" in r.json()

            # Pipelined requests are answered in order; 100-continue works.
            out = raw(g.port,
                      b"GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n"
                      b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
                      b"POST /generate HTTP/1.1\r\nHost: x\r\n"
                      b"Expect: 100-continue\r\nContent-Length: 13\r\n\r\n"
                      b'{"text":"hi"}'
                      b"GET /health HTTP/1.1\r\nHost: x\r\n"
                      b"Connection: close\r\n\r\n")
            statuses = re.findall(rb"HTTP/1.1 (\d{3})", out)
            assert statuses == [b"200", b"404", b"100", b"200", b"200"], out

            rnd = random.Random(4)
            t_end = time.monotonic() + 60
            for i in range(10000):
                if time.monotonic() > t_end:
                    break
                g_bytes = bytes(rnd.getrandbits(8)
                                for _ in range(rnd.randint(1, 200)))
                if i % 2:
                    g_bytes = b"POST /generate HTTP/1.1\r\n" + g_bytes
                try:
                    s = socket.create_connection(("127.0.0.1", g.port),
                                                 timeout=1)
                    s.sendall(g_bytes)
                    s.shutdown(socket.SHUT_WR)
                    try:
                        s.recv(256)
                    except OSError:
                        pass
                    s.close()
                except OSError:
                    pass
            assert i > 1000
            assert g.get("/liveness").status == 200
            assert g.post("/generate", GEN).status == 200
            g.stop()
    finally:
        w.stop()
