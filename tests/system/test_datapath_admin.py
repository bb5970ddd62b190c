"""Fan-out routes and model aliases through the gateway.

/flush_cache reaches every worker (200, or 206 partial_success naming the
failed ones); /get_loads returns gateway.md §9.4, with the Prometheus
fallback of workers.md §3 filling `details` for workers without /v1/loads
(SGLang and vLLM names); --model-alias routes by the canonical model and
hands the worker a body whose `model` is the canonical id.
"""
import http.server
import json
import socket
import threading

import gw
import sim
import util


class EchoWorker:
    """A minimal engine run by the test: registers as an SGLang worker
    serving `model`, has neither /v1/loads nor /metrics, and answers each
    inference POST with what it received (path, headers, raw body)."""

    def __init__(self, model):
        self.model = model
        self.heads = []  # paths of POSTs whose head arrived
        self.received = []
        worker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                m = worker.model
                if self.path == "/health":
                    self.reply(200, {})
                elif self.path == "/v1/models":
                    self.reply(200, {"object": "list", "data": [
                        {"id": m, "object": "model", "owned_by": "sglang"}]})
                elif self.path in ("/model_info", "/get_model_info"):
                    self.reply(200, {"model_path": m})
                elif self.path in ("/server_info", "/get_server_info"):
                    self.reply(200, {"served_model_name": m})
                else:
                    self.reply(404, {"error": "not found"})

            def do_POST(self):
                worker.heads.append(self.path)
                n = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(n)
                if len(raw) < n:  # the gateway gave up mid-body
                    worker.received.append({"path": self.path,
                                            "truncated": len(raw)})
                    self.close_connection = True
                    return
                body = raw.decode(errors="replace")
                got = {"path": self.path, "body": body,
                       "headers": {k.lower(): v
                                   for k, v in self.headers.items()}}
                worker.received.append(got)
                self.reply(200, got)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def stream_open(port, tokens=5000):
    """A streamed /generate sent straight to a simworker and left open,
    so the worker counts one running request."""
    body = json.dumps({"text": "keep me busy", "stream": True,
                       "sampling_params": {"max_new_tokens": tokens}})
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))
    assert s.recv(64).startswith(b"HTTP/1.1 200")
    return s


def loads_by_url(g):
    r = g.get("/get_loads")
    assert r.status == 200, r
    body = r.json()
    assert list(body) == ["workers"]
    return {e["worker"]: e for e in body["workers"]}


def test_flush_cache_and_get_loads(tmp_path):
    # w1: SGLang with /v1/loads; w2: vLLM without it; w3: SGLang without
    # it; e: an engine with neither /v1/loads nor /metrics.
    w1 = sim.start_simworker(tmp_path)
    w2 = sim.start_simworker(tmp_path, "--engine", "vllm", "--no-loads")
    w3 = sim.start_simworker(tmp_path, "--no-loads")
    e = EchoWorker("sim-model")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w1.url, w2.url, w3.url,
                              e.url) as g:
            g.wait_ready(4)
            busy = [stream_open(w.port) for w in (w1, w2, w3)]
            busy.append(stream_open(w2.port))

            def counted():
                ls = loads_by_url(g)
                return all(ls[w.url].get("details") and
                           ls[w.url]["details"]["loads"][0]
                           ["num_running_reqs"] == n
                           for w, n in ((w1, 1), (w2, 2), (w3, 1))) and ls
            ls = util.wait_for(counted, timeout=10,
                               what="running requests in the loads")
            assert list(ls) == [w1.url, w2.url, w3.url, e.url]

            # /v1/loads: the worker's own report, load = used tokens.
            d1 = ls[w1.url]["details"]
            r1 = d1["loads"][0]
            assert r1["max_total_num_tokens"] > 0
            assert ls[w1.url]["load"] == r1["num_used_tokens"] > 0
            assert "num_waiting_uncached_tokens" in r1

            # Prometheus fallback: one synthetic rank, no token counts.
            for w, engine_fields in ((w2, ()), (w3, ("utilization",))):
                ent = ls[w.url]
                assert ent["load"] == -1
                assert ent["details"]["dp_rank_count"] == 1
                r = ent["details"]["loads"][0]
                assert r["dp_rank"] == 0
                assert r["num_waiting_reqs"] == 0
                assert 0 < r["token_usage"] <= 1
                assert "num_used_tokens" not in r
                assert "max_total_num_tokens" not in r
                for f in engine_fields:
                    assert f in r
            assert "utilization" not in ls[w2.url]["details"]["loads"][0]
            assert ls[w2.url]["details"]["loads"][0]["gen_throughput"] == 0

            # Neither source: load -1, no details.
            assert ls[e.url] == {"worker": e.url, "load": -1}

            # Asked again (the absent /v1/loads remembered): same shape.
            again = loads_by_url(g)
            assert again[w2.url]["details"]["loads"][0][
                "num_running_reqs"] == 2
            for s in busy:
                s.close()

            # /flush_cache: everyone flushes, e answers 200 to any POST.
            def flushed():
                r = g.post("/flush_cache")
                return r if r.status == 200 else None
            r = util.wait_for(flushed, timeout=10, what="a full flush")
            assert r.json() == {"status": "success",
                                "message": "Cache flushed on all workers",
                                "workers_flushed": 4,
                                "total_http_workers": 4}
            assert any(x["path"] == "/flush_cache" for x in e.received)

            # A worker busy with a request refuses (400), one is down:
            # 206 partial_success naming both.
            busy = stream_open(w1.port)
            w3.proc.kill()
            r = g.post("/flush_cache")
            busy.close()
            assert r.status == 206, r
            body = r.json()
            assert body["status"] == "partial_success"
            assert body["workers_flushed"] == 2
            assert body["total_http_workers"] == 4
            failed = {f["worker"]: f["error"] for f in body["failed"]}
            assert failed == {w1.url: "HTTP 400",
                              w3.url: "connection failed"}
            assert g.get("/flush_cache").status in (404, 405)
            g.stop()
    finally:
        e.stop()
        for w in (w1, w2):
            w.stop()


def test_model_alias(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    e = EchoWorker("org/canon-a")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url, e.url,
                              "--model-alias", "a=org/canon-a",
                              "--model-alias", "short=sim-model") as g:
            g.wait_ready(2)

            # The alias routes by the canonical model: always to e, and
            # e gets the body with the canonical id, the rest intact.
            req = {"model": "a", "stream": False, "max_tokens": 3,
                   "messages": [{"role": "user", "content": "héllo"}],
                   "extra": {"nested": [1, 2.5, None, True]}}
            for _ in range(4):
                r = g.post("/v1/chat/completions", req)
                assert r.status == 200, r
                assert r.headers["x-smg-routed-worker-id"] == e.url
                got = json.loads(r.json()["body"])
                assert got == dict(req, model="org/canon-a")
                assert r.json()["headers"]["content-type"] == \
                    "application/json"

            # The canonical name itself: routed the same, body unchanged
            # byte for byte (no re-serialisation).
            raw = ('{ "model" : "org/canon-a",  "prompt": "x",'
                   '"max_tokens":1 }')
            r = g.post("/v1/completions", raw,
                       headers={"Content-Type": "application/json"})
            assert r.status == 200, r
            assert r.json()["body"] == raw

            # An alias of the other model goes to the simworker.
            r = g.post("/v1/completions", {"model": "short", "prompt": "x",
                                           "max_tokens": 2})
            assert r.status == 200, r
            assert r.headers["x-smg-routed-worker-id"] == w.url

            # Neither a model nor an alias: 404 model_not_found.
            r = g.post("/v1/completions", {"model": "b", "prompt": "x"})
            assert r.status == 404, r
            assert r.json()["error"]["code"] == "model_not_found"
            assert r.headers["x-smg-error-code"] == "model_not_found"

            # /v1/models lists the canonical ids.
            ids = sorted(m["id"] for m in g.get("/v1/models").json()["data"])
            assert ids == ["org/canon-a", "sim-model"]
            g.stop()
    finally:
        e.stop()
        w.stop()
