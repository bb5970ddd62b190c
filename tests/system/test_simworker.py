"""System tests of smg-simworker, the simulated SGLang/vLLM engine."""
import http.client
import json
import signal
import socket
import subprocess
import threading
import time

import msgpack
import pytest
import zmq

import util
from sim import start_simworker

PREFIX = "".join(f"shared prefix sentence number {i:04d}. " for i in range(112))
assert len(PREFIX) >= 4000


@pytest.fixture
def workers(tmp_path):
    """start(*args) starts a simworker; all are stopped (and checked)."""
    started = []

    def start(*args, **kw):
        w = start_simworker(tmp_path, *args, **kw)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


def completion(port, prompt, **kw):
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 4}
    body.update(kw)
    r = util.post(port, "/v1/completions", body)
    assert r.status == 200, r
    return r.json()


def cached(resp):
    return resp["usage"]["prompt_tokens_details"]["cached_tokens"]


def metric(port, name):
    text = util.get(port, "/metrics").body.decode()
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def sse_events(port, path, body, headers=None):
    """Posts a streaming request; returns (response, [(time, data)])."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers=dict(headers or {},
                                  **{"Content-Type": "application/json"}))
        r = conn.getresponse()
        events, buf = [], b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                assert ev.startswith(b"data: "), ev
                events.append((time.monotonic(), ev[6:].decode()))
        return r, events
    finally:
        conn.close()


def test_prefix_sharing_and_flush(workers):
    w = workers("--time-scale", "0")
    first = completion(w.port, PREFIX + "first question?")
    assert cached(first) == 0
    assert first["usage"]["prompt_tokens"] == (len(PREFIX) + 15 + 3) // 4
    second = completion(w.port, PREFIX + "a different question")
    assert cached(second) >= 900
    assert cached(second) % 16 == 0
    # SGLang's /generate reports it in meta_info.
    r = util.post(w.port, "/generate",
                  {"text": PREFIX + "third", "sampling_params":
                   {"max_new_tokens": 2}})
    assert r.status == 200, r
    assert r.json()["meta_info"]["cached_tokens"] >= 900
    assert r.json()["meta_info"]["completion_tokens"] == 2
    r = util.post(w.port, "/flush_cache", {})
    assert r.status == 200, r
    third = completion(w.port, PREFIX + "a different question")
    assert cached(third) == 0
    st = w.stats()
    assert st["requests"] == 4
    assert st["cached_tokens"] >= 1800
    assert 0 < st["hit_rate"] < 1
    assert st["routes"]["/v1/completions"] == 3
    assert st["ttft_ms"]["p50"] is not None
    w.reset_stats()
    assert w.stats()["requests"] == 0


def test_chat_prefix_and_input_ids(workers):
    w = workers("--time-scale", "0")
    msgs = [{"role": "system", "content": PREFIX}]
    for q in ("one", "two"):
        r = util.post(w.port, "/v1/chat/completions",
                      {"messages": msgs + [{"role": "user", "content": q}],
                       "max_completion_tokens": 3})
        assert r.status == 200, r
        body = r.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] == 3
    assert cached(body) >= 900
    ids = list(range(1000, 1100))
    util.post(w.port, "/generate", {"input_ids": ids})
    r = util.post(w.port, "/v1/completions", {"prompt": ids + [5]})
    assert r.json()["usage"]["prompt_tokens"] == 101
    assert cached(r.json()) == 96


def test_in_flight_visible_on_loads_and_metrics(workers):
    w = workers()
    result = {}

    def held():
        result["r"] = util.post(w.port, "/v1/completions",
                                {"prompt": "hold me", "max_tokens": 2,
                                 "sim_hold_ms": 1500})

    t = threading.Thread(target=held)
    t.start()
    try:
        def running():
            load = util.get(w.port, "/v1/loads").json()["loads"][0]
            return load["num_running_reqs"] == 1 and load
        load = util.wait_for(running, timeout=5, what="running request")
        assert load["max_total_num_tokens"] == 524288
        assert load["num_used_tokens"] > 0
        assert load["max_running_requests"] == 256
        assert metric(w.port, "sglang:num_running_reqs") == 1
        assert metric(w.port, "sglang:token_usage") > 0
    finally:
        t.join(10)
    assert result["r"].status == 200
    load = util.get(w.port, "/v1/loads").json()["loads"][0]
    assert load["num_running_reqs"] == 0
    assert metric(w.port, "sglang:num_running_reqs") == 0


def test_queue_beyond_batch_limit(workers):
    w = workers("--max-running", "1")
    threads = [threading.Thread(target=util.post, args=(
        w.port, "/generate", {"text": f"request {i}", "sim_hold_ms": 800,
                              "sampling_params": {"max_new_tokens": 1}}))
        for i in range(2)]
    for t in threads:
        t.start()
    try:
        def queued():
            load = util.get(w.port, "/v1/loads").json()["loads"][0]
            return (load["num_running_reqs"] == 1 and
                    load["num_waiting_reqs"] == 1 and load)
        load = util.wait_for(queued, timeout=5, what="one queued request")
        assert load["num_waiting_uncached_tokens"] > 0
        assert metric(w.port, "sglang:num_queue_reqs") == 1
    finally:
        for t in threads:
            t.join(10)
    assert w.stats()["requests"] == 2


@pytest.fixture
def kv_sub():
    """subscribe(worker, endpoint, topic) -> (SUB socket, first frames).
    Sends requests until a batch arrives: ZMQ drops what is published
    before the subscription reaches the publisher."""
    ctx = zmq.Context()
    socks = []

    def subscribe(w, endpoint, topic=b""):
        sub = ctx.socket(zmq.SUB)
        socks.append(sub)
        sub.setsockopt(zmq.SUBSCRIBE, topic)
        sub.setsockopt(zmq.RCVTIMEO, 200)
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(endpoint)
        for i in range(25):
            completion(w.port, f"{i:03d} " + PREFIX[:200])
            try:
                return sub, sub.recv_multipart()
            except zmq.Again:
                continue
        raise AssertionError("no KV event batch received")

    yield subscribe
    for sub in socks:
        sub.close()
    ctx.term()


def test_kv_events_block_stored(workers, kv_sub):
    endpoint = f"tcp://127.0.0.1:{util.free_port()}"
    w = workers("--time-scale", "0", "--kv-events-endpoint", endpoint)
    sub, frames = kv_sub(w, endpoint)
    assert len(frames) == 3
    assert frames[0] == b""
    assert len(frames[1]) == 8
    seq = int.from_bytes(frames[1], "big")
    batch = msgpack.unpackb(frames[2])
    assert isinstance(batch, list) and len(batch) == 2
    assert isinstance(batch[0], float)
    stored = [e for e in batch[1] if e[0] == "BlockStored"]
    # 204 characters = 51 tokens = 3 full pages, one event each.
    assert len(stored) == 3
    assert stored[0][2] is None
    for prev, cur in zip(stored, stored[1:]):
        assert cur[2] == prev[1][0]
    for e in stored:
        assert len(e[1]) == 1 and len(e[3]) == 16 and e[4] == 16
        assert -2**63 <= e[1][0] < 2**63
    # A flush publishes AllBlocksCleared in the next batch.
    assert util.post(w.port, "/flush_cache", {}).status == 200
    frames = sub.recv_multipart()
    assert int.from_bytes(frames[1], "big") == seq + 1
    assert msgpack.unpackb(frames[2])[1] == [["AllBlocksCleared"]]


def test_kv_events_map_form(workers, kv_sub):
    endpoint = f"tcp://127.0.0.1:{util.free_port()}"
    w = workers("--time-scale", "0", "--engine", "vllm",
                "--kv-events-endpoint", endpoint,
                "--kv-events-format", "map", "--kv-events-topic", "kv")
    _, frames = kv_sub(w, endpoint, b"kv")
    assert frames[0] == b"kv"
    batch = msgpack.unpackb(frames[2])
    assert set(batch) >= {"ts", "events"}
    ev = batch["events"][0]
    assert ev["type"] == "BlockStored"
    assert ev["parent_block_hash"] is None
    assert ev["block_size"] == 16 and len(ev["token_ids"]) == 16
    assert batch["events"][1]["parent_block_hash"] == ev["block_hashes"][0]


def test_kv_eviction_publishes_block_removed(workers, kv_sub):
    endpoint = f"tcp://127.0.0.1:{util.free_port()}"
    w = workers("--time-scale", "0", "--kv-capacity", "256",
                "--kv-events-endpoint", endpoint)
    sub, _ = kv_sub(w, endpoint)
    assert util.post(w.port, "/flush_cache", {}).status == 200
    stored, removed = [], []
    # 101 prompt tokens (6 full pages) + 2 output: the third evicts.
    for i in range(4):
        completion(w.port, f"{i:03d} " + "x" * 400, max_tokens=2)
    deadline = time.monotonic() + 5
    while len(stored) < 24 and time.monotonic() < deadline:
        try:
            _, _, payload = sub.recv_multipart()
        except zmq.Again:
            continue
        for e in msgpack.unpackb(payload)[1]:
            if e[0] == "BlockStored":
                stored.append(e[1][0])
            elif e[0] == "BlockRemoved":
                assert e[1][0] in stored, "removed a page never stored"
                removed.append(e[1][0])
    assert len(stored) == 24
    # Capacity 16 pages: the 3rd request evicts 3 pages, the 4th 6 more,
    # least recently used (the first request's) first, deepest first.
    assert removed[:6] == stored[5::-1]
    assert len(removed) == 9
    assert w.stats()["cached_tokens"] == 0


def test_streaming_arrives_as_events(workers):
    w = workers("--decode-base-ms", "20")
    r, events = sse_events(w.port, "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 8, "stream": True})
    assert r.status == 200
    assert r.getheader("Content-Type") == "text/event-stream"
    assert r.getheader("Transfer-Encoding") == "chunked"
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert len(chunks) == 9          # 8 tokens + the usage chunk
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[7]["choices"][0]["finish_reason"] == "length"
    assert chunks[8]["usage"]["completion_tokens"] == 8
    # Tokens are paced by decode steps (20 ms each), not sent at once.
    assert events[7][0] - events[0][0] >= 0.1
    # SGLang's /generate stream: cumulative text, meta_info, [DONE].
    r, events = sse_events(w.port, "/generate",
                           {"text": "hi", "stream": True,
                            "sampling_params": {"max_new_tokens": 3}})
    assert [e[1] for e in events][-1] == "[DONE]"
    gen = [json.loads(d) for _, d in events[:-1]]
    assert len(gen) == 3
    assert len(gen[2]["text"]) == 12 and gen[2]["text"].startswith(
        gen[1]["text"])
    assert gen[2]["meta_info"]["finish_reason"]["type"] == "length"


def test_bad_input_gets_400_and_server_keeps_serving(workers):
    w = workers("--time-scale", "0")
    bad = [("/v1/completions", b"{not json"),
           ("/v1/completions", b"[1, 2]"),
           ("/v1/completions", b'{"max_tokens": 3}'),
           ("/v1/completions", b'{"prompt": "x", "max_tokens": -1}'),
           ("/v1/completions", b'{"prompt": "x", "max_tokens": "many"}'),
           ("/v1/completions", b'{"prompt": ["a", "b"]}'),
           ("/v1/completions", b'{"prompt": "x", "stream": "yes"}'),
           ("/v1/chat/completions", b'{"messages": []}'),
           ("/v1/chat/completions", b'{"messages": [{"content": "x"}]}'),
           ("/generate", b'{"sampling_params": {}}'),
           ("/generate", b'{"input_ids": [1, -2]}'),
           ("/generate", b'{"text": "x", "sampling_params": 3}'),
           ("/v1/completions", b'{"prompt": "x", "max_tokens": 40000}'),
           ("/v1/completions", b"")]
    for path, body in bad:
        r = util.post(w.port, path, body,
                      headers={"Content-Type": "application/json"})
        assert r.status == 400, (path, body, r)
        err = r.json()
        assert err["object"] == "error" and err["code"] == 400
        assert err["message"]
    assert util.get(w.port, "/nope").status == 404
    # Malformed HTTP: 400 and a close, and the server goes on.
    with socket.create_connection(("127.0.0.1", w.port), timeout=5) as s:
        s.sendall(b"GARBAGE \x01\x02\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    # Several requests on one keep-alive connection, one chunked body.
    conn = http.client.HTTPConnection("127.0.0.1", w.port, timeout=5)
    conn.request("POST", "/v1/completions", body=b"{oops")
    r = conn.getresponse()
    assert r.status == 400 and r.read()
    conn.request("POST", "/v1/completions",
                 body=iter([b'{"prompt": "chun', b'ked", "max_tokens": 2}']),
                 encode_chunked=True,
                 headers={"Transfer-Encoding": "chunked"})
    r = conn.getresponse()
    assert r.status == 200
    assert json.loads(r.read())["usage"]["completion_tokens"] == 2
    conn.close()
    assert w.stats()["rejected"] == len(bad) + 1
    completion(w.port, "still serving")


def test_fault_injection(workers):
    w = workers("--time-scale", "0")
    assert w.control(fail_rate=1.0)["fail_rate"] == 1.0
    r = util.post(w.port, "/v1/completions", {"prompt": "x"})
    assert r.status == 500 and r.json()["code"] == 500
    w.control(status=503)
    assert util.post(w.port, "/generate", {"text": "x"}).status == 503
    w.control(fail_rate=0.0, close_rate=1.0)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        r = util.post(w.port, "/v1/completions", {"prompt": "x"})
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        sse_events(w.port, "/v1/completions",
                   {"prompt": "x", "stream": True, "max_tokens": 8})
    w.control(close_rate=0.0, hang_rate=1.0)
    with pytest.raises(socket.timeout):
        util.post(w.port, "/v1/completions", {"prompt": "x"}, timeout=0.5)
    w.control(hang_rate=0.0)
    completion(w.port, "healthy again")
    st = w.stats()
    assert st["failed"] == 2 and st["closed"] == 2 and st["hung"] == 1
    r = util.post(w.port, "/sim/control", {"fail_rate": 2})
    assert r.status == 400
    r = util.post(w.port, "/sim/control", b"{")
    assert r.status == 400


def test_fault_flags_and_start_delay(workers):
    w = workers("--fail-rate", "1", "--fail-status", "429",
                "--start-delay", "0.6", wait_healthy=False)
    assert util.get(w.port, "/health").status == 503
    util.wait_for(lambda: util.get(w.port, "/health").status == 200,
                  timeout=5, what="end of the start delay")
    assert util.post(w.port, "/v1/completions",
                     {"prompt": "x"}).status == 429


def test_health_toggle(workers):
    w = workers("--time-scale", "10")
    assert util.get(w.port, "/health_generate").status == 200
    w.control(healthy=False)
    assert util.get(w.port, "/health").status == 503
    assert util.get(w.port, "/health_generate").status == 503
    completion(w.port, "inference still works")
    w.control(healthy=True)
    assert util.get(w.port, "/health").status == 200


def test_no_loads_and_metadata(workers):
    w = workers("--no-loads", "--model", "org/llama-8b",
                "--worker-id", "w7")
    r = util.get(w.port, "/v1/loads")
    assert r.status == 404
    assert r.headers["x-sim-worker"] == "w7"
    assert metric(w.port, "sglang:token_usage") == 0
    m = util.get(w.port, "/v1/models").json()["data"][0]
    assert m["id"] == "org/llama-8b" and m["owned_by"] == "sglang"
    for path in ("/get_model_info", "/model_info"):
        assert util.get(w.port, path).json()["model_path"] == "org/llama-8b"
    info = util.get(w.port, "/get_server_info").json()
    assert info["max_running_requests"] == 256
    assert util.get(w.port, "/server_info").status == 200
    assert util.get(w.port, "/version").status == 404


def test_vllm_engine(workers):
    w = workers("--engine", "vllm", "--time-scale", "0")
    text = util.get(w.port, "/metrics").body.decode()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc",
                 "vllm:gpu_prefix_cache_hit_rate"):
        assert name + "{" in text
    assert "sglang:" not in text
    assert util.get(w.port, "/v1/models").json()["data"][0]["owned_by"] \
        == "vllm"
    assert util.get(w.port, "/version").status == 200
    assert util.get(w.port, "/server_info").status == 404
    completion(w.port, PREFIX)
    completion(w.port, PREFIX + "again")
    assert metric(w.port, "vllm:gpu_prefix_cache_hit_rate") > 0.3


def test_echoes_routing_headers(workers):
    w = workers("--time-scale", "0")
    r = util.post(w.port, "/v1/completions", {"prompt": "x"},
                  headers={"x-smg-routing-key": "user-42",
                           "X-Request-Id": "req-1"})
    assert r.status == 200
    assert r.headers["x-sim-routing-key"] == "user-42"
    assert r.headers["x-sim-request-id"] == "req-1"
    assert r.headers["x-sim-worker"] == str(w.port)
    r = util.post(w.port, "/v1/completions", {"prompt": "x"})
    assert "x-sim-routing-key" not in r.headers


def test_client_gone_mid_request(workers):
    w = workers()
    # Disconnect while requests are queued, running and streaming.
    socks = []
    for stream in (False, True, False):
        s = socket.create_connection(("127.0.0.1", w.port), timeout=5)
        body = json.dumps({"prompt": "bye " * 50, "max_tokens": 200,
                           "stream": stream}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        socks.append(s)
    util.wait_for(lambda: w.stats()["running"] == 3, timeout=5,
                  what="three running")
    for s in socks:
        s.close()
    util.wait_for(lambda: w.stats()["running"] == 0, timeout=5,
                  what="requests dropped")
    completion(w.port, "after the disconnects")


def test_bad_flags_exit_2():
    for args in (["--bogus"], ["--port", "70000"], ["--engine", "tgi"],
                 ["--time-scale"], ["--kv-events-format", "json"]):
        p = subprocess.run([util.binary("smg-simworker"), *args],
                           capture_output=True, text=True, timeout=10)
        assert p.returncode == 2, (args, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and args[0] in lines[0], (args, p.stderr)


def test_sigint_exits_cleanly(tmp_path):
    w = start_simworker(tmp_path, "--time-scale", "0")
    try:
        completion(w.port, "x")
    finally:
        w.proc.stop(sig=signal.SIGINT)


def test_expect_100_continue_and_pipelining(workers):
    w = workers("--time-scale", "0")
    body = json.dumps({"prompt": "y" * 2000, "max_tokens": 1}).encode()
    with socket.create_connection(("127.0.0.1", w.port), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Expect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        # The body, then two pipelined requests in one write.
        s.sendall(body + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                  b"Connection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 3
    assert data.index(b"text_completion") < data.index(b"sim-model\",\"object")
