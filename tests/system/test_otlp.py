"""OpenTelemetry spans (--enable-trace, --otlp-traces-endpoint): a fake
OTLP/HTTP collector decodes what the gateway posts (the protobuf wire
format read by hand: no protobuf package needed) and the spans must form
the request's tree under the client's span, with the attempt's span as
the parent the worker saw. A collector that refuses or hangs must cost
the requests nothing: they all succeed and the spans are counted as
dropped."""
import http.server
import json
import re
import socket
import subprocess
import threading
import time

import gw
import util
from test_datapath_admin import EchoWorker

TP = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


# ---------------------------------------------------------------- protobuf
def varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def fields(buf):
    """(number, value) of each field of a message: ints for varint and
    fixed fields, bytes for length-delimited ones."""
    i, out = 0, []
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v = int.from_bytes(buf[i:i + 8], "little")
            i += 8
        elif wt == 5:
            v = int.from_bytes(buf[i:i + 4], "little")
            i += 4
        elif wt == 2:
            n, i = varint(buf, i)
            v = bytes(buf[i:i + n])
            i += n
        else:
            raise ValueError(f"wire type {wt}")
        out.append((num, v))
    return out


def any_value(buf):
    for num, v in fields(buf):
        if num == 1:
            return v.decode()
        if num == 2:
            return bool(v)
        if num == 3:
            return v - (1 << 64) if v >= 1 << 63 else v
    return None


def key_values(bufs):
    out = {}
    for b in bufs:
        f = dict(fields(b))
        out[f[1].decode()] = any_value(f.get(2, b""))
    return out


def decode_export(body):
    """ExportTraceServiceRequest -> (resource attributes, [span dicts])."""
    spans, resource = [], {}
    for num, rs in fields(body):
        assert num == 1
        for n2, v2 in fields(rs):
            if n2 == 1:
                resource = key_values(
                    [v for n, v in fields(v2) if n == 1])
            elif n2 == 2:
                for n3, v3 in fields(v2):
                    if n3 != 2:
                        continue
                    sp = {"attrs": {}, "parent": "", "status": 0}
                    attrs = []
                    for n4, v4 in fields(v3):
                        if n4 == 1:
                            sp["trace"] = v4.hex()
                        elif n4 == 2:
                            sp["span"] = v4.hex()
                        elif n4 == 4:
                            sp["parent"] = v4.hex()
                        elif n4 == 5:
                            sp["name"] = v4.decode()
                        elif n4 == 6:
                            sp["kind"] = v4
                        elif n4 == 7:
                            sp["start"] = v4
                        elif n4 == 8:
                            sp["end"] = v4
                        elif n4 == 9:
                            attrs.append(v4)
                        elif n4 == 15:
                            sp["status"] = dict(fields(v4)).get(3, 0)
                        elif n4 == 16:
                            sp["flags"] = v4
                    sp["attrs"] = key_values(attrs)
                    spans.append(sp)
    return resource, spans


class Collector:
    """OTLP/HTTP receiver on loopback: POST /v1/traces, protobuf body.
    hang: accept and never answer (a collector stuck)."""

    def __init__(self, hang=False):
        self.spans, self.resources, self.posts = [], [], []
        self.hang = hang
        self.release = threading.Event()
        col = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                col.posts.append((self.path,
                                  self.headers.get("Content-Type")))
                if col.hang:
                    col.release.wait(30)
                    return
                res, spans = decode_export(body)
                col.resources.append(res)
                col.spans.extend(spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def of_trace(self, tid):
        return [s for s in self.spans if s["trace"] == tid]


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


BODY = {"model": "echo-model", "prompt": "x", "max_tokens": 1}


def metric(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_spans_form_the_request_tree(tmp_path):
    ew = EchoWorker("echo-model")
    col = Collector()
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", ew.url, "--enable-trace",
                         "--otlp-traces-endpoint", f"127.0.0.1:{col.port}")
    try:
        g.wait_ready(1)
        tid = "4bf92f3577b34da6a3ce929d0e0e4736"
        client_span = "00f067aa0ba902b7"
        r = g.post("/v1/completions", BODY, headers={
            "traceparent": f"00-{tid}-{client_span}-01",
            "x-request-id": "otlp-req-1"})
        assert r.status == 200, r
        m = TP.match(ew.received[-1]["headers"]["traceparent"])
        assert m and m.group(1) == tid and m.group(3) == "01"
        worker_parent = m.group(2)

        util.wait_for(lambda: len(col.of_trace(tid)) >= 3, timeout=15,
                      what="three spans at the collector")
        spans = col.of_trace(tid)
        assert len(spans) == 3, spans
        assert col.posts[0] == ("/v1/traces", "application/x-protobuf")
        assert col.resources[0]["service.name"] == "smg"
        by_name = {}
        for s in spans:
            by_name.setdefault(s["kind"], []).append(s)
        (req,) = by_name[2]  # SERVER
        (route,) = by_name[1]  # INTERNAL
        (att,) = by_name[3]  # CLIENT
        # The request's span hangs under the client's.
        assert req["parent"] == client_span
        assert req["span"] != client_span
        assert req["attrs"]["http.request.method"] == "POST"
        assert req["attrs"]["url.path"] == "/v1/completions"
        assert req["attrs"]["http.response.status_code"] == 200
        assert req["attrs"]["smg.request_id"] == "otlp-req-1"
        assert req["name"] == "POST /v1/completions"
        assert req["flags"] & 0x3FF == 0x301  # sampled, remote parent
        # The decision and the attempt under the request's span.
        assert route["parent"] == req["span"]
        assert route["name"] == "smg.route"
        assert route["attrs"]["smg.policy"] == "round_robin"
        assert route["attrs"]["smg.attempt"] == 0
        assert route["attrs"]["gen_ai.request.model"] == "echo-model"
        assert att["parent"] == req["span"]
        assert att["attrs"]["server.address"] == "127.0.0.1"
        assert att["attrs"]["server.port"] == ew.port
        assert att["attrs"]["http.response.status_code"] == 200
        assert att["attrs"]["smg.worker_type"] == "regular"
        # The worker saw the attempt's span as its parent.
        assert worker_parent == att["span"]
        # Times nest: request around decision and attempt.
        assert req["start"] <= route["start"] <= route["end"]
        assert req["start"] <= att["start"] <= att["end"] <= req["end"]
        assert route["end"] <= att["start"]
        assert all(s["status"] == 0 for s in spans)

        # No traceparent: a new trace, sampled, rooted at the gateway.
        r = g.post("/v1/completions", BODY)
        assert r.status == 200
        m = TP.match(ew.received[-1]["headers"]["traceparent"])
        assert m and m.group(3) == "01"
        tid2 = m.group(1)
        util.wait_for(lambda: len(col.of_trace(tid2)) >= 3, timeout=15,
                      what="spans of the new trace")
        roots = [s for s in col.of_trace(tid2) if s["kind"] == 2]
        assert len(roots) == 1 and roots[0]["parent"] == ""
        assert [s for s in col.of_trace(tid2)
                if s["kind"] == 3][0]["span"] == m.group(2)

        # A client that did not sample: relayed, nothing recorded.
        tid3 = "0af7651916cd43dd8448eb211c80319c"
        r = g.post("/v1/completions", BODY, headers={
            "traceparent": f"00-{tid3}-b7ad6b7169203331-00"})
        assert r.status == 200
        m = TP.match(ew.received[-1]["headers"]["traceparent"])
        assert m.group(1) == tid3 and m.group(3) == "00"
        util.wait_for(lambda: metric(g.metrics(),
                                     "smg_trace_spans_exported_total") >= 6,
                      timeout=10, what="exported count")
        time.sleep(1.5)
        assert col.of_trace(tid3) == []
        assert metric(g.metrics(), "smg_trace_spans_dropped_total") == 0
    finally:
        g.stop()
        col.stop()
        ew.stop()


def test_retry_has_an_attempt_span_each(tmp_path):
    """A worker gone after it was found ready: the requests routed to it
    take two attempts, with two client spans and two decisions; the
    second attempt carries its resend count."""
    ew = EchoWorker("echo-model")
    gone = EchoWorker("echo-model")
    col = Collector()
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", ew.url, gone.url, "--enable-trace",
                         "--otlp-traces-endpoint",
                         f"http://127.0.0.1:{col.port}/v1/traces",
                         "--retry-max-retries", "3",
                         "--retry-initial-backoff-ms", "1",
                         "--health-check-interval-secs", "3600",
                         "--disable-circuit-breaker")
    try:
        g.wait_ready(2)
        gone.stop()
        tids = []
        for i in range(4):
            tid = f"{i + 1:032x}"
            tids.append(tid)
            r = g.post("/v1/completions", BODY, headers={
                "traceparent": f"00-{tid}-00000000000000aa-01"})
            assert r.status == 200, r
        util.wait_for(lambda: all(len(col.of_trace(t)) >= 3 for t in tids),
                      timeout=15, what="spans of every request")
        retried = [t for t in tids
                   if len([s for s in col.of_trace(t) if s["kind"] == 3]) > 1]
        assert retried, "round robin sent no request to the dead worker"
        spans = col.of_trace(retried[0])
        req = [s for s in spans if s["kind"] == 2][0]
        atts = sorted((s for s in spans if s["kind"] == 3),
                      key=lambda s: s["start"])
        routes = [s for s in spans if s["kind"] == 1]
        assert len(routes) == len(atts) == 2
        assert all(s["parent"] == req["span"] for s in atts + routes)
        assert atts[0]["status"] == 2  # ERROR
        assert atts[0]["attrs"]["error.type"] == "transport"
        assert atts[1]["attrs"]["http.request.resend_count"] == 1
        assert atts[1]["attrs"]["http.response.status_code"] == 200
        assert atts[0]["span"] != atts[1]["span"]
    finally:
        g.stop()
        col.stop()
        ew.stop()


def test_collector_down_costs_nothing(tmp_path):
    """Refused and hanging collectors: every request succeeds, the spans
    are dropped and counted, one warning line at most per 10 s."""
    ew = EchoWorker("echo-model")
    hang = Collector(hang=True)
    for endpoint in (f"127.0.0.1:{closed_port()}", f"127.0.0.1:{hang.port}"):
        d = tmp_path / endpoint.replace(":", "_")
        d.mkdir()
        g = gw.start_gateway(d, "--policy", "round_robin",
                             "--worker-urls", ew.url, "--enable-trace",
                             "--otlp-traces-endpoint", endpoint)
        try:
            g.wait_ready(1)
            t0 = time.monotonic()
            for _ in range(40):
                r = g.post("/v1/completions", BODY)
                assert r.status == 200, r
            util.wait_for(
                lambda: metric(g.metrics(),
                               "smg_trace_spans_dropped_total") >= 3,
                timeout=15, what="dropped spans counted")
            m = g.metrics()
            assert 'reason="export_failed"' in m
            assert metric(m, "smg_trace_spans_exported_total") == 0
            assert time.monotonic() - t0 < 30
            assert g.log().count("export to http://") <= 3
        finally:
            g.stop()
    hang.stop()
    ew.stop()
    assert hang.posts, "the hanging collector was never tried"


def test_bad_endpoint_refused():
    r = subprocess.run([util.binary("smg"), "--worker-urls",
                        "http://127.0.0.1:1", "--enable-trace",
                        "--otlp-traces-endpoint", "grpc://h:4317", "-n"],
                       capture_output=True, text=True,
                       timeout=20 * util.TIMEOUT_MULT,
                       start_new_session=True)
    assert r.returncode != 0
    assert "--otlp-traces-endpoint" in r.stderr


def test_pd_has_an_attempt_span_per_leg(tmp_path):
    from test_pd_disagg import _pd_args, _pd_sims, _stop
    prefill, decode = _pd_sims(tmp_path)
    col = Collector()
    try:
        with gw.start_gateway(tmp_path, *_pd_args(
                prefill, decode, "--policy", "round_robin",
                "--enable-trace", "--otlp-traces-endpoint",
                f"127.0.0.1:{col.port}")) as g:
            g.wait_ready(2)
            tid = "5bf92f3577b34da6a3ce929d0e0e4736"
            r = g.post("/generate", {"text": "hello world",
                                     "sampling_params": {"max_new_tokens": 2}},
                       headers={"traceparent":
                                f"00-{tid}-00f067aa0ba902b7-01"})
            assert r.status == 200, r
            util.wait_for(lambda: len(col.of_trace(tid)) >= 4, timeout=15,
                          what="the PD request's spans")
            spans = col.of_trace(tid)
            (req,) = [s for s in spans if s["kind"] == 2]
            (route,) = [s for s in spans if s["kind"] == 1]
            legs = {s["attrs"]["smg.worker_type"]: s
                    for s in spans if s["kind"] == 3}
            assert sorted(legs) == ["decode", "prefill"]
            assert req["parent"] == "00f067aa0ba902b7"
            assert route["parent"] == req["span"]
            assert all(s["parent"] == req["span"] for s in legs.values())
            assert legs["prefill"]["attrs"]["smg.worker.url"] == \
                prefill[0].url
            assert legs["decode"]["attrs"]["smg.worker.url"] == decode[0].url
            assert legs["prefill"]["span"] != legs["decode"]["span"]
            assert route["attrs"]["smg.worker.url"] == \
                f"{prefill[0].url},{decode[0].url}"
    finally:
        col.stop()
        _stop(*prefill, *decode)
