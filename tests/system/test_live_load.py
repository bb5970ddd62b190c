"""Live load: the prompt tokens a frontend sent that still wait for their
first response body byte, per worker, summed over frontends.

The broker exports them as smg_worker_outstanding_prefill_tokens. A slow
worker holds a request's prompt there until its first byte; every way a
request ends gives the tokens back: success, the client going away, a
worker error retried elsewhere, a worker that closes the connection, a
hung worker cut by the timeout, and a frontend killed mid-request (its
row is reclaimed).
"""
import http.client
import json
import re
import signal
import socket
import threading
import time

import gw
import sim
import util

PROMPT = "word " * 2000  # 10,000 chars: ~2,500 tokens at chars/4


def outstanding(g):
    """{worker url: tokens} from the gauge."""
    out = {}
    for line in g.metrics().splitlines():
        m = re.match(r'smg_worker_outstanding_prefill_tokens\{worker="([^"]*)"'
                     r'\} (\d+)', line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def total(g):
    return sum(outstanding(g).values())


def stream_in_thread(port, body, results, timeout=30.0):
    def run():
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            c.request("POST", "/v1/completions", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            results.append((r.status, r.read()))
            c.close()
        except (OSError, http.client.HTTPException) as e:
            results.append((0, str(e).encode()))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def body(stream=True, max_tokens=4):
    return {"model": "sim-model", "prompt": PROMPT, "max_tokens": max_tokens,
            "stream": stream}


def wait_zero(g, what):
    util.wait_for(lambda: total(g) == 0, timeout=10.0,
                  what=f"outstanding tokens back to 0 after {what}")


def wait_positive(g, what):
    util.wait_for(lambda: total(g) > 0, timeout=10.0,
                  what=f"outstanding tokens while {what}")


def test_every_end_releases_live_load(tmp_path):
    # 200 tokens/s: a 2,500-token prompt waits ~12 s for its first byte.
    slow = sim.start_simworker(tmp_path, "--prefill-tps", 200, name="slow")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--retry-initial-backoff-ms", "1",
                          "--request-timeout-secs", "3",
                          "--worker-urls", slow.url, frontends=2) as g:
        g.wait_ready(1)
        assert total(g) == 0

        # 1. The client goes away before the first byte.
        s = socket.create_connection(("127.0.0.1", g.port))
        data = json.dumps(body()).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: a\r\n"
                  b"Content-Type: application/json\r\nContent-Length: " +
                  str(len(data)).encode() + b"\r\n\r\n" + data)
        wait_positive(g, "a client waits")
        got = outstanding(g)[slow.url]
        assert 2000 <= got <= 3000, got
        s.close()
        wait_zero(g, "the client went away")

        # 2. The worker hangs: the request timeout ends the attempt.
        results = []
        t = stream_in_thread(g.port, body(), results)
        wait_positive(g, "a request waits on a slow worker")
        t.join(30)
        # The head went out before the first token: the stream is cut.
        assert results and (results[0][0] == 504 or
                            b"IncompleteRead" in results[0][1]), results
        wait_zero(g, "the timeout")

        # 3. A frontend killed while its request waits: its row goes.
        results = []
        threads = [stream_in_thread(g.port, body(), results)
                   for _ in range(4)]
        wait_positive(g, "requests wait on both frontends")
        for pid in g.pids()["frontend"]:
            try:
                import os
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for t in threads:
            t.join(30)
        wait_zero(g, "the frontends died")
        util.wait_for(lambda: len(g.pids()["frontend"]) == 2,
                      what="frontends restarted")
        g.stop()
    slow.stop()


def test_success_and_errors_release_live_load(tmp_path):
    fast = sim.start_simworker(tmp_path, "--prefill-tps", 20000, name="fast")
    bad = sim.start_simworker(tmp_path, "--fail-rate", 1, "--fail-status",
                              500, name="bad")
    closing = sim.start_simworker(tmp_path, "--close-rate", 1,
                                  name="closing")
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--retry-initial-backoff-ms", "1",
                          "--disable-circuit-breaker",
                          "--worker-urls", fast.url, bad.url, closing.url
                          ) as g:
        g.wait_ready(3)
        # Requests land on each worker in turn: 500s are retried on the
        # next worker; a connection cut after bytes went out ends the
        # client's response too.
        ok = 0
        for stream in (True, False):
            for _ in range(6):
                results = []
                stream_in_thread(g.port, body(stream=stream),
                                 results).join(30)
                assert results[0][0] == 200 or \
                    b"IncompleteRead" in results[0][1], results
                ok += results[0][0] == 200
        assert ok >= 4
        wait_zero(g, "successes, worker errors and closed connections")
        m = g.metrics()
        assert "smg_worker_retries_total" in m
        # The rate learner saw the streamed successes of the fast worker.
        rates = {}
        for line in m.splitlines():
            r = re.match(r'smg_worker_prefill_rate_tokens_per_second'
                         r'\{worker="([^"]*)"\} (\d+)', line)
            if r:
                rates[r.group(1)] = int(r.group(2))
        assert rates.get(fast.url, 0) > 0, rates
        g.stop()
    for w in (fast, bad, closing):
        w.stop()
