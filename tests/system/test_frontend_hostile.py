"""No request, however malformed or long, changes a frontend's pid.

Long request targets get 414 on every route (single and PD paths, the
gateway's own endpoints, the worker API); 10,000 hostile requests (mutated
seeds, long targets, bad framing) leave every process in place; every
response is counted once with the status it carried, 408 and reader
errors included; a request whose worker drops the connection is sent to
it at most once per attempt.
"""
import random
import re
import socket
import threading
import time

import gw
import sim
import util

LONG = "x" * 3000
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


def raw(port, data, timeout=2.0, half_close=True):
    """Sends data, half-closes (unless told not to), returns what came
    back before EOF."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        try:
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out = b""
        while True:
            try:
                d = s.recv(65536)
            except OSError:
                break
            if not d:
                break
            out += d
        return out
    finally:
        s.close()


def metric_sum(text, family, **labels):
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(family + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": "sim-model", "prompt": "x"}),
    ("POST", "/generate", {"text": "x"}),
    ("GET", "/get_model_info", None),
    ("GET", "/get_server_info", None),
    ("GET", "/health_generate", None),
    ("GET", "/v1/models", None),
    ("GET", "/readiness", None),
    ("GET", "/workers", None),
    ("GET", "/workers/abc", None),
    ("POST", "/flush_cache", {}),
    ("GET", "/get_loads", None),
    ("GET", "/no/such/route", None),
]


def assert_long_targets_414(g):
    before = g.pids()
    for method, path, body in ROUTES:
        r = g.request(method, f"{path}?q={LONG}", body=body)
        assert r.status == 414, (path, r)
        err = r.json()["error"]
        assert err["code"] == "uri_too_long", (path, err)
        # The connection still serves the next request.
        assert g.get("/liveness").status == 200
    assert g.pids() == before
    m = g.metrics()
    assert metric_sum(m, "smg_http_responses_total",
                      status_code="414") >= len(ROUTES)


def test_long_targets_every_route(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--worker-urls", w.url) as g:
        g.wait_ready(1)
        assert_long_targets_414(g)
        g.stop()
    w.stop()


def test_long_targets_pd(tmp_path):
    rdv = tmp_path / "rdv"
    rdv.mkdir()
    pre = sim.start_simworker(tmp_path, "--role", "prefill",
                              "--bootstrap-port", 9170, "--bootstrap-dir",
                              rdv, "--time-scale", "0", name="prefill")
    dec = sim.start_simworker(tmp_path, "--role", "decode", "--bootstrap-dir",
                              rdv, "--time-scale", "0", name="decode")
    with gw.start_gateway(tmp_path, "--pd-disaggregation", "--prefill",
                          pre.url, 9170, "--decode", dec.url) as g:
        g.wait_ready(2)
        assert_long_targets_414(g)
        g.stop()
    pre.stop()
    dec.stop()


SEEDS = [
    b"GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
    b"Content-Length: 17\r\nExpect: 100-continue\r\n\r\n"
    b'{"model":"m","a"}',
    b"POST /generate HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
    b"\r\n4;ext=1\r\nWiki\r\n5\r\npedia\r\n0\r\nTrailer: t\r\n\r\n",
    b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    b"GET http://h:1/p?q#f HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
    b"POST /b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"1\r\nz\r\n0\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: a\r\nX-Smg-Routing-Key: k\r\n\r\n",
    b"POST /v1/chat/completions?" + LONG.encode() +
    b" HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /get_model_info?" + LONG.encode() + b" HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /generate HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET /health HTTP/2.0\r\nHost: a\r\n\r\n",
]
TOKENS = [b"\r\n", b"\n", b"\r", b" ", b"\t", b":", b"\r\n\r\n",
          b"0\r\n\r\n", b"Content-Length: 5\r\n",
          b"Transfer-Encoding: chunked\r\n", b"ffffffff", b";", b"\0",
          b"HTTP/1.1", b"?", b"#", b"Connection: close\r\n", b"%",
          b"?" + b"q" * 2500]


def hostile(rnd):
    data = bytearray(rnd.choice(SEEDS))
    for _ in range(rnd.randint(0, 6)):
        pos = rnd.randint(0, len(data))
        op = rnd.randint(0, 2)
        if op == 0:
            data[pos:pos] = rnd.choice(TOKENS)
        elif op == 1 and data:
            del data[pos:pos + rnd.randint(1, 8)]
        else:
            data[pos:pos] = bytes(rnd.getrandbits(8)
                                  for _ in range(rnd.randint(1, 16)))
    return bytes(data)


def test_hostile_requests_keep_pids(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                          "--worker-urls", w.url, frontends=2) as g:
        g.wait_ready(1)
        before = g.pids()
        rnd = random.Random(13)
        sent = 0
        statuses = {}
        t_end = time.monotonic() + 240
        while sent < 10000 and time.monotonic() < t_end:
            out = b""
            try:
                out = raw(g.port, hostile(rnd), timeout=1.0)
            except OSError:
                pass
            sent += 1
            for st in re.findall(rb"^HTTP/1\.[01] (\d{3})", out, re.M):
                statuses[int(st)] = statuses.get(int(st), 0) + 1
        assert sent == 10000, f"only {sent} requests in the time allowed"
        assert g.pids() == before, "a frontend was restarted"
        assert "AddressSanitizer" not in g.log()
        assert "runtime error" not in g.log()
        # Every 414 a client saw was counted once, with its status.
        util.wait_for(lambda: metric_sum(
            g.metrics(), "smg_http_responses_total",
            status_code="414") == statuses.get(414, 0),
            what="414 count")
        assert statuses.get(414, 0) > 0
        assert g.post("/v1/chat/completions", CHAT).status == 200
        g.stop()
    w.stop()


def test_timeouts_and_reader_errors_counted(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--stream-body-stall-timeout-secs", 1,
                          "--worker-urls", w.url) as g:
        g.wait_ready(1)
        # A body that stops arriving: 408, counted as 408.
        out = raw(g.port, b"POST /generate HTTP/1.1\r\nHost: a\r\n"
                  b"Content-Length: 100\r\n\r\n{\"text\"", timeout=5.0,
                  half_close=False)
        assert out.startswith(b"HTTP/1.1 408"), out
        # An HTTP version the reader refuses: 505, counted as 505.
        out = raw(g.port, b"GET /health HTTP/2.0\r\nHost: a\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 505"), out
        # Conflicting framing: 400, counted as 400.
        out = raw(g.port, b"POST /generate HTTP/1.1\r\nHost: a\r\n"
                  b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"0\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400"), out

        def counted():
            m = g.metrics()
            return (metric_sum(m, "smg_http_responses_total",
                               status_code="408") == 1 and
                    metric_sum(m, "smg_http_responses_total",
                               status_code="505") == 1 and
                    metric_sum(m, "smg_http_responses_total",
                               status_code="400") == 1 and
                    metric_sum(m, "smg_http_responses_total",
                               status_code="4xx") == 0)
        util.wait_for(counted, what="408/505/400 counted with their status")
        # A normal response is counted on its route.
        assert g.post("/generate", {"text": "x"}).status == 200
        util.wait_for(lambda: metric_sum(
            g.metrics(), "smg_http_responses_total", path="/generate",
            status_code="200") == 1, what="200 counted")
        g.stop()
    w.stop()


class DroppingWorker:
    """Reads each request and closes the connection without answering;
    counts the inference requests it received."""

    def __init__(self):
        self.posts = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stopping = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        self.sock.settimeout(0.1)
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self.one, args=(c,), daemon=True).start()

    def one(self, c):
        c.settimeout(2)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                d = c.recv(65536)
                if not d:
                    return
                data += d
            if data.startswith(b"POST"):
                with self.lock:
                    self.posts += 1
            elif data.startswith(b"GET /health"):
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                          b"Connection: close\r\n\r\n{}")
            elif data.startswith(b"GET /v1/models"):
                body = (b'{"object":"list","data":[{"id":"sim-model",'
                        b'"object":"model"}]}')
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: " +
                          str(len(body)).encode() +
                          b"\r\nConnection: close\r\n\r\n" + body)
            else:
                c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n"
                          b"Connection: close\r\n\r\n")
        except OSError:
            pass
        finally:
            c.close()

    def stop(self):
        self.stopping = True
        self.thread.join(2)
        self.sock.close()


def test_resend_at_most_once(tmp_path):
    w = DroppingWorker()
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--disable-retries",
                              "--disable-circuit-breaker",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            for i in range(5):
                r = g.post("/generate", {"text": "x"})
                assert r.status == 500, r
                assert r.json()["error"]["code"] == \
                    "call_upstream_request_error"
                # One attempt, on a new connection: sent exactly once.
                assert w.posts == i + 1, w.posts
            g.stop()
    finally:
        w.stop()


def test_control_plane_loopback_only_without_key(tmp_path):
    """No --api-key: the worker API answers loopback clients only (403 to
    others, one startup warning); with a key it answers anyone who has it."""
    import os
    addrs = [a for a in os.popen("hostname -I").read().split()
             if ":" not in a and not a.startswith("127.")]
    if not addrs:
        import pytest
        pytest.skip("no non-loopback IPv4 address on this host")
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--host", "0.0.0.0",
                              "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            assert g.get("/workers").status == 200
            c = socket.create_connection((addrs[0], g.port), timeout=5)
            c.sendall(b"GET /workers HTTP/1.1\r\nHost: a\r\n"
                      b"Connection: close\r\n\r\n")
            out = b""
            while True:
                d = c.recv(65536)
                if not d:
                    break
                out += d
            c.close()
            assert out.startswith(b"HTTP/1.1 403"), out
            assert b"admin_loopback_only" in out
            # Inference is not the control plane: served from anywhere.
            c = socket.create_connection((addrs[0], g.port), timeout=5)
            body = b'{"text":"x"}'
            c.sendall(b"POST /generate HTTP/1.1\r\nHost: a\r\n"
                      b"Content-Length: " + str(len(body)).encode() +
                      b"\r\nConnection: close\r\n\r\n" + body)
            out = c.recv(65536)
            c.close()
            assert out.startswith(b"HTTP/1.1 200"), out
            assert g.log().count("answers only on loopback") == 1
            g.stop()
    finally:
        w.stop()
