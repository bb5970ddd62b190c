"""A client that goes away while its non-streaming request waits on the
worker: the frontend notices it at once (not when the response is ready),
drops the upstream request and ends the in-flight count. Pipelined
requests sent while one is in progress are still answered in order.
"""
import json
import re
import socket
import time

import gw
import sim
import util

HOLD = {"text": "hold me", "sampling_params": {"max_new_tokens": 2},
        "sim_hold_ms": 5000}


def active_total(g):
    total = 0
    for line in g.metrics().splitlines():
        m = re.match(r'smg_worker_requests_active\{[^}]*\} (\d+)', line)
        if m:
            total += int(m.group(1))
    return total


def running(w):
    return util.get(w.port, "/v1/loads").json()["loads"][0][
        "num_running_reqs"]


def post_raw(body, extra=b""):
    return (b"POST /generate HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n%s" % (len(body), extra, body))


def held_then_gone(g, w, how):
    s = socket.create_connection(("127.0.0.1", g.port), timeout=5)
    try:
        s.sendall(post_raw(json.dumps(HOLD).encode()))
        util.wait_for(lambda: active_total(g) == 1 and running(w) == 1,
                      timeout=3, what="one request held by the worker")
        time.sleep(0.5)
        how(s)
        t = time.monotonic()
        util.wait_for(lambda: active_total(g) == 0 and running(w) == 0,
                      timeout=3, what="request gone on both sides")
        assert time.monotonic() - t < 1.0 * util.TIMEOUT_MULT
    finally:
        s.close()


@util.skip_under_valgrind
def test_client_close_cancels_held_request(tmp_path):
    w = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            # Plain close (FIN).
            held_then_gone(g, w, lambda s: s.close())

            # Reset (SO_LINGER 0 sends RST on close).
            def reset(s):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                             b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()
            held_then_gone(g, w, reset)

            # Half close after a complete request: treated as gone too.
            held_then_gone(g, w, lambda s: s.shutdown(socket.SHUT_WR))

            # The gateway keeps serving.
            r = util.post(g.port, "/generate",
                          {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
            assert r.status == 200
            g.stop()
    finally:
        w.stop()


def test_pipelined_during_held_request(tmp_path):
    w = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            first = dict(HOLD, sim_hold_ms=600)
            quick = {"text": "q", "sampling_params": {"max_new_tokens": 2}}
            s = socket.create_connection(("127.0.0.1", g.port),
                                         timeout=5 * util.TIMEOUT_MULT)
            try:
                s.sendall(post_raw(json.dumps(first).encode()))
                util.wait_for(lambda: running(w) == 1, timeout=3,
                              what="first request held")
                # Sent while the first waits on the worker: read and kept.
                s.sendall(post_raw(json.dumps(quick).encode()) +
                          post_raw(json.dumps(quick).encode(),
                                   b"Connection: close\r\n"))
                out = b""
                deadline = time.monotonic() + 10 * util.TIMEOUT_MULT
                while time.monotonic() < deadline:
                    d = s.recv(65536)
                    if not d:
                        break
                    out += d
            finally:
                s.close()
            heads = re.findall(rb"HTTP/1\.1 (\d{3}) ", out)
            assert heads == [b"200", b"200", b"200"], out[:2000]
            assert out.count(b"x-request-id") == 3
            g.stop()
    finally:
        w.stop()
