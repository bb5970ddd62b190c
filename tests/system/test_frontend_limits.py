"""Timeouts and limits that fit LLM traffic: a request body must keep a
minimum rate (a trickle cannot hold a connection), the request bodies a
frontend holds have a cap (503 beyond), and a stream whose first token
or next chunk does not come in time is cut instead of held.
"""
import http.client
import json
import re
import socket
import time

import gw
import sim
import util


def metric_sum(text, family, **labels):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(family + "{") or line.startswith(family + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def read_all(s, timeout):
    s.settimeout(timeout)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass
    return out


def test_body_trickle_is_cut(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--body-min-rate-bytes-per-sec", "100",
                          "--worker-urls", w.url) as g:
        g.wait_ready(1)
        s = socket.create_connection(("127.0.0.1", g.port))
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: a\r\n"
                  b"Content-Length: 100000\r\n\r\n")
        t0 = time.monotonic()
        out = b""
        s.settimeout(0.05)
        # 20 bytes a second: far under the minimum, but never idle.
        while time.monotonic() - t0 < 20:
            try:
                s.sendall(b"x" * 20)
            except OSError:
                break
            try:
                d = s.recv(4096)
                if d:
                    out += d
                    break
            except socket.timeout:
                pass
            except OSError:
                break
            time.sleep(1)
        out += read_all(s, 2)
        s.close()
        took = time.monotonic() - t0
        assert out.startswith(b"HTTP/1.1 408"), out
        assert took < 15, took
        assert metric_sum(g.metrics(), "smg_frontend_slow_bodies_total") >= 1
        assert g.post("/generate", {"text": "x"}).status == 200
        g.stop()
    w.stop()


def test_buffered_bodies_capped(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--max-buffered-bytes-total", "150000",
                          "--worker-urls", w.url) as g:
        g.wait_ready(1)
        head = (b"POST /generate HTTP/1.1\r\nHost: a\r\n"
                b"Content-Length: 1000000\r\n\r\n")
        a = socket.create_connection(("127.0.0.1", g.port))
        a.sendall(head + b"x" * 100000)
        time.sleep(0.5)
        b = socket.create_connection(("127.0.0.1", g.port))
        b.sendall(head + b"x" * 100000)
        out = read_all(b, 5)
        assert out.startswith(b"HTTP/1.1 503"), out
        assert b"gateway_overloaded" in out
        b.close()
        a.close()
        # Released with its connection: a normal request passes.
        util.wait_for(lambda: g.post("/generate", {"text": "x"}).status
                      == 200, what="normal request after the cap")
        assert metric_sum(g.metrics(),
                          "smg_frontend_body_buffer_refusals_total") == 1
        g.stop()
    w.stop()


def test_stream_first_byte_timeout(tmp_path):
    # 100 tokens/s: a 2,500-token prompt's first token is 25 s away.
    w = sim.start_simworker(tmp_path, "--prefill-tps", "100")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--stream-first-byte-timeout-secs", "1",
                          "--worker-urls", w.url) as g:
        g.wait_ready(1)
        t0 = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", g.port, timeout=20)
        c.request("POST", "/v1/completions", body=json.dumps(
            {"model": "sim-model", "prompt": "word " * 2000,
             "max_tokens": 4, "stream": True}),
            headers={"Content-Type": "application/json"})
        r = c.getresponse()
        try:
            body = r.read()
            status = r.status
        except http.client.IncompleteRead:
            body, status = b"", 0
        c.close()
        took = time.monotonic() - t0
        # Cut (head already relayed) or 504 (retries used up): never the
        # 25 s the worker would take.
        assert status in (0, 504) or b"data:" not in body, (status, body)
        assert took < 12, took
        util.wait_for(lambda: metric_sum(
            g.metrics(), "smg_router_stream_timeouts_total",
            kind="first_byte") >= 1, what="first-byte timeout counted")
        g.stop()
    w.stop()


def test_pd_stream_outlives_idle_timeout(tmp_path):
    """A finished prefill leg ends its own attempt: a decode stream longer
    than --stream-idle-timeout-secs is not cut, no breaker failure."""
    rdv = tmp_path / "rdv"
    rdv.mkdir()
    pre = sim.start_simworker(tmp_path, "--role", "prefill",
                              "--bootstrap-port", 9171, "--bootstrap-dir",
                              rdv, name="prefill")
    dec = sim.start_simworker(tmp_path, "--role", "decode", "--bootstrap-dir",
                              rdv, "--decode-base-ms", 100, name="decode")
    try:
        with gw.start_gateway(tmp_path, "--pd-disaggregation", "--prefill",
                              pre.url, 9171, "--decode", dec.url,
                              "--stream-idle-timeout-secs", "2") as g:
            g.wait_ready(2)
            c = http.client.HTTPConnection("127.0.0.1", g.port, timeout=30)
            c.request("POST", "/generate", body=json.dumps(
                {"text": "hello", "stream": True,
                 "sampling_params": {"max_new_tokens": 40}}),
                headers={"Content-Type": "application/json"})
            r = c.getresponse()
            body = r.read()
            c.close()
            assert r.status == 200
            assert b"[DONE]" in body, body[-200:]
            m = g.metrics()
            assert metric_sum(m, "smg_router_stream_timeouts_total") == 0
            assert metric_sum(m, "smg_worker_cb_outcomes_total",
                              outcome="failure") == 0
            g.stop()
    finally:
        pre.stop()
        dec.stop()


def test_client_that_stops_reading_is_not_the_workers_fault(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--stream-idle-timeout-secs", "2",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", g.port))
            data = json.dumps({"model": "sim-model", "prompt": "x",
                               "max_tokens": 30000, "stream": True})
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: a\r\n"
                      b"Content-Type: application/json\r\n"
                      b"Content-Length: " + str(len(data)).encode() +
                      b"\r\n\r\n" + data.encode())
            time.sleep(5)  # not reading
            util.wait_for(lambda: metric_sum(
                g.metrics(), "smg_router_stream_timeouts_total",
                kind="client") == 1, what="client stall counted")
            s.close()
            m = g.metrics()
            assert metric_sum(m, "smg_worker_cb_outcomes_total",
                              outcome="failure") == 0
            assert g.post("/v1/completions",
                          {"model": "sim-model", "prompt": "x",
                           "max_tokens": 2}).status == 200
            g.stop()
    finally:
        w.stop()
