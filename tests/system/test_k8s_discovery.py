"""Kubernetes service discovery against a fake API server.

FakeK8s below is a small Kubernetes API: GET /api/v1/namespaces/NS/pods
lists pods (labelSelector honoured, resourceVersion in the list's
metadata) and, with watch=1, streams ADDED/MODIFIED/DELETED events as
chunked newline-delimited JSON held open until the test drops the watch
(mid-stream, no terminating chunk) or ends it cleanly; a watch from a
resourceVersion older than the server still keeps answers 410 Gone. Pods
point at real simworkers, each on its own loopback address and the one
--service-discovery-port. The gateway must reflect pod changes in
GET /workers within 2 s, also after a dropped or expired watch, route only
to ready pods, and never touch a worker it did not discover.
"""
import http.client
import json
import os
import signal
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gw
import sim
import util

TOKEN = "test-token-0123"
NS = "llm"
# A change must show within 2 s (valgrind stretches everything).
WITHIN = 2.0 * (util.TIMEOUT_MULT if util.VALGRIND else 1.0)


def pod_json(name, labels, ip, ready=True, annotations=None, rv=1,
             deleting=False):
    meta = {"name": name, "namespace": NS, "uid": f"uid-{name}",
            "resourceVersion": str(rv), "labels": labels,
            "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return {
        "kind": "Pod", "apiVersion": "v1", "metadata": meta,
        "status": {
            "phase": "Running", "podIP": ip,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }


def matches(pod, selector):
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


class FakeK8s:
    """The API server: a pod store with a resourceVersion counter and an
    event log that watches follow."""

    def __init__(self):
        self.cond = threading.Condition()
        self.pods = {}
        self.rv = 100
        self.events = []          # (rv, type, old pod or None, new pod)
        self.oldest_rv = 0        # a watch from before this: 410
        self.drop_gen = 0         # bumped: watches close abruptly
        self.end_gen = 0          # bumped: watches end cleanly
        self.lists = 0
        self.watches = 0
        self.gone = 0
        self.unauthorized = 0
        self.stopping = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                fake.handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       daemon=True)
        self.thread.start()

    def close(self):
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # -- what the test does
    def _change(self, etype, name, new):
        with self.cond:
            self.rv += 1
            old = self.pods.get(name)
            if new is not None:
                new["metadata"]["resourceVersion"] = str(self.rv)
                self.pods[name] = new
            else:
                del self.pods[name]
                new = old
            self.events.append((self.rv, etype, old, new))
            self.cond.notify_all()

    def add(self, name, labels, ip, ready=True, annotations=None):
        self._change("ADDED", name, pod_json(name, labels, ip, ready,
                                             annotations))

    def set_ready(self, name, ready):
        with self.cond:
            p = json.loads(json.dumps(self.pods[name]))
        p["status"]["conditions"][1]["status"] = "True" if ready else "False"
        self._change("MODIFIED", name, p)

    def delete(self, name):
        self._change("DELETED", name, None)

    def inject(self, raw):
        """Sends raw bytes (plus a newline) to every watch: hostile input."""
        with self.cond:
            self.rv += 1
            self.events.append((self.rv, "RAW", None, raw))
            self.cond.notify_all()

    def drop_watches(self):
        """Closes every open watch mid-stream (no terminating chunk)."""
        with self.cond:
            self.drop_gen += 1
            self.cond.notify_all()

    def end_watches_and_expire(self):
        """Ends watches cleanly and forgets every resourceVersion so far:
        the client's resumed watch gets 410 Gone."""
        with self.cond:
            self.oldest_rv = self.rv + 1
            self.end_gen += 1
            self.cond.notify_all()

    # -- the API
    def handle(self, h):
        u = urllib.parse.urlsplit(h.path)
        q = urllib.parse.parse_qs(u.query)
        if h.headers.get("Authorization") != f"Bearer {TOKEN}":
            with self.cond:
                self.unauthorized += 1
            return self.reply(h, 401, {"kind": "Status", "code": 401})
        if u.path != f"/api/v1/namespaces/{NS}/pods":
            return self.reply(h, 404, {"kind": "Status", "code": 404})
        selector = {}
        for term in ",".join(q.get("labelSelector", [])).split(","):
            if term:
                k, _, v = term.partition("=")
                selector[k] = v
        if q.get("watch", ["0"])[0] in ("1", "true"):
            return self.watch(h, selector, int(q["resourceVersion"][0]))
        with self.cond:
            self.lists += 1
            items = [p for p in self.pods.values() if matches(p, selector)]
            body = {"kind": "PodList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items}
        self.reply(h, 200, body)

    def reply(self, h, status, obj):
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def chunk(self, h, data):
        h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        h.wfile.flush()

    def watch(self, h, selector, since):
        with self.cond:
            self.watches += 1
            if since < self.oldest_rv:
                self.gone += 1
                stale = True
            else:
                stale = False
            drop, end = self.drop_gen, self.end_gen
        if stale:
            return self.reply(h, 410, {"kind": "Status", "code": 410,
                                       "reason": "Expired"})
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        last = since
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(
                        lambda: self.stopping or self.drop_gen != drop or
                        self.end_gen != end or
                        (self.events and self.events[-1][0] > last),
                        timeout=1.0)
                    if self.stopping or self.drop_gen != drop:
                        h.close_connection = True
                        h.connection.shutdown(2)
                        return
                    if self.end_gen != end:
                        h.wfile.write(b"0\r\n\r\n")
                        h.wfile.flush()
                        return
                    out = []
                    for rv, etype, old, new in self.events:
                        if rv <= last:
                            continue
                        last = rv
                        if etype == "RAW":
                            out.append(new)
                        elif matches(new, selector):
                            out.append({"type": etype, "object": new})
                        elif old is not None and matches(old, selector):
                            out.append({"type": "DELETED", "object": new})
                for ev in out:
                    data = ev if isinstance(ev, bytes) else \
                        json.dumps(ev).encode()
                    self.chunk(h, data + b"\n")
        except OSError:
            h.close_connection = True


def http_get(host, port, path, timeout=2.0):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def start_pod_sim(tmp_path, host, port, name, *extra):
    """A simworker on host:port (the pod's address)."""
    argv = [util.binary("smg-simworker"), "--host", host, "--port",
            str(port), *map(str, extra)]
    proc = util.Proc(name, argv, tmp_path)
    try:
        util.wait_for(lambda: http_get(host, port, "/health") == 200,
                      what=f"{name} /health")
    except BaseException:
        proc.kill()
        raise
    return proc


def metric(g, family, labels):
    """The value of family{labels} in g's /metrics, or None."""
    want = f"{family}{{{labels}}} "
    for line in g.metrics().splitlines():
        if line.startswith(want):
            return float(line[len(want):])
    return None


def urls(g):
    r = g.get("/workers", timeout=3)
    assert r.status == 200, r
    return {w["url"]: w for w in r.json()["workers"]}


def within(pred, what):
    """pred() true within WITHIN seconds of now."""
    t0 = time.monotonic()
    util.wait_for(pred, timeout=10, interval=0.02, what=what)
    took = time.monotonic() - t0
    assert took <= WITHIN, f"{what}: took {took:.2f} s"
    return took


def route_targets(g, n=8):
    seen = set()
    for _ in range(n):
        r = g.post("/v1/completions", {"model": "sim-model", "prompt": "hi",
                                       "max_tokens": 2})
        assert r.status == 200, r
        seen.add(r.headers["x-smg-routed-worker-id"])
    return seen


def gateway_env(tmp_path, api):
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    return {"SMG_K8S_API": api.url, "SMG_K8S_TOKEN_FILE": str(tok),
            "SMG_K8S_CA_FILE": str(tmp_path / "no-ca.crt")}


def test_discovery_follows_pods(tmp_path):
    port = util.free_port()
    sel = {"app": "sglang", "tier": "gpu"}
    api = FakeK8s()
    sims = []
    manual = None
    try:
        for i, host in enumerate(("127.0.0.2", "127.0.0.3", "127.0.0.4")):
            sims.append(start_pod_sim(tmp_path, host, port, f"pod{i}",
                                      "--time-scale", "0"))
        manual = sim.start_simworker(tmp_path, "--time-scale", "0")
        ua, ub, uc = (f"http://127.0.0.{i}:{port}" for i in (2, 3, 4))
        ux = f"http://127.0.0.9:{port}"
        api.add("a", dict(sel), "127.0.0.2")
        api.add("b", dict(sel), "127.0.0.3", ready=False)
        api.add("x", {"app": "sglang", "tier": "cpu"}, "127.0.0.9")
        with gw.start_gateway(
                tmp_path, "--service-discovery", "--selector", "app=sglang",
                "tier=gpu", "--service-discovery-port", port,
                "--service-discovery-namespace", NS,
                "--policy", "round_robin",
                env=gateway_env(tmp_path, api)) as g:
            g.wait_live()
            util.wait_for(lambda: ua in urls(g), timeout=10,
                          what="pod a listed")
            g.wait_ready(1)
            seen = urls(g)
            assert ub not in seen and ux not in seen, seen
            assert seen[ua]["worker_type"] == "regular"
            assert route_targets(g) == {ua}
            util.wait_for(lambda: metric(g, "smg_discovery_synced",
                                         'role="regular"') == 1,
                          what="discovery in sync")
            assert metric(g, "smg_discovery_pods",
                          'role="regular",ready="true"') == 1
            assert metric(g, "smg_discovery_pods",
                          'role="regular",ready="false"') == 1
            errors = metric(g, "smg_discovery_api_errors_total",
                            'role="regular"')

            # An operator's worker: discovery never removes it.
            r = g.post("/workers", {"url": manual.url})
            assert r.status == 202, r
            util.wait_for(lambda: manual.url in urls(g), what="manual")

            # Not ready -> ready -> not ready: added, routed to, removed.
            api.set_ready("b", True)
            within(lambda: ub in urls(g), "pod b ready: listed")
            util.wait_for(lambda: urls(g)[ub]["status"] == "Ready",
                          what="b Ready")
            assert ub in route_targets(g, 12)
            api.set_ready("b", False)
            within(lambda: ub not in urls(g), "pod b not ready: removed")
            assert ub not in route_targets(g, 12)

            # Added, then deleted.
            api.add("c", dict(sel), "127.0.0.4")
            within(lambda: uc in urls(g), "pod c added")
            api.delete("c")
            within(lambda: uc not in urls(g), "pod c deleted")

            # The watch drops mid-stream; a pod added meanwhile shows.
            lists = api.lists
            api.drop_watches()
            api.add("c", dict(sel), "127.0.0.4")
            within(lambda: uc in urls(g), "pod c after a dropped watch")
            assert api.lists > lists

            # The watch ends and its resourceVersion expires: 410, list.
            api.end_watches_and_expire()
            api.delete("c")
            within(lambda: uc not in urls(g), "pod c after 410")
            assert api.gone >= 1

            # Hostile events: garbage is skipped, an endless line (2 MB)
            # ends the watch with a log line; the next list catches up.
            api.inject(b"{not json")
            api.inject(b'{"type":"ADDED","object":{"metadata":{"name":1}}}')
            api.inject(b"x" * (2 * 1024 * 1024))
            api.add("c", dict(sel), "127.0.0.4")
            within(lambda: uc in urls(g), "pod c after hostile events")
            api.delete("c")
            within(lambda: uc not in urls(g), "pod c deleted again")
            log = g.log()
            assert "unreadable watch event" in log
            assert "longer than 1048576 bytes" in log
            assert metric(g, "smg_discovery_api_errors_total",
                          'role="regular"') > errors

            # The poller restarts while a pod goes: its first list
            # reconciles.
            old = g.pids()["poller"]
            assert len(old) == 1
            os.kill(old[0], signal.SIGKILL)
            api.set_ready("b", True)
            api.delete("a")
            util.wait_for(lambda: len(g.pids()["poller"]) == 1 and
                          g.pids()["poller"] != old, timeout=15,
                          what="poller restarted")
            util.wait_for(lambda: ua not in urls(g) and ub in urls(g),
                          timeout=10, what="reconciled after restart")
            seen = urls(g)
            assert manual.url in seen and ux not in seen, seen

            # Every pod gone: only the operator's worker is left.
            api.delete("b")
            within(lambda: set(urls(g)) == {manual.url}, "all pods gone")
            assert api.unauthorized == 0
            log = g.log()
            assert "smg-poller" in log
            g.stop()
    finally:
        api.close()
        for p in sims:
            p.stop()
        if manual is not None:
            manual.stop()


def start_pd_pods(tmp_path, api, port, rdv, sims, prefill_port,
                  *prefill_extra):
    """A prefill pod on 127.0.0.2 (its bootstrap port annotated) and a
    decode pod on 127.0.0.3, started (into sims) and listed by api; their
    URLs."""
    sims.append(start_pod_sim(
        tmp_path, "127.0.0.2", port, "prefill0", "--role", "prefill",
        "--bootstrap-port", prefill_port, "--bootstrap-dir", rdv,
        "--worker-id", "P0", *prefill_extra))
    sims.append(start_pod_sim(
        tmp_path, "127.0.0.3", port, "decode0", "--role", "decode",
        "--bootstrap-dir", rdv, "--bootstrap-timeout", 2,
        "--worker-id", "D0"))
    api.add("p0", {"app": "sglang", "role": "prefill"}, "127.0.0.2",
            annotations={"sglang.ai/bootstrap-port": str(prefill_port)})
    api.add("d0", {"app": "sglang", "role": "decode"}, "127.0.0.3")
    return tuple(f"http://127.0.0.{i}:{port}" for i in (2, 3))


def test_discovery_pd(tmp_path):
    port = util.free_port()
    rdv = tmp_path / "rdv"
    rdv.mkdir()
    api = FakeK8s()
    sims = []
    try:
        up, ud = start_pd_pods(tmp_path, api, port, rdv, sims, 9150)
        api.add("r0", {"app": "sglang", "role": "router"}, "127.0.0.5")
        with gw.start_gateway(
                tmp_path, "--service-discovery", "--pd-disaggregation",
                "--prefill-selector", "app=sglang", "role=prefill",
                "--decode-selector", "app=sglang", "role=decode",
                "--service-discovery-port", port,
                "--service-discovery-namespace", NS,
                "--policy", "round_robin",
                env=gateway_env(tmp_path, api)) as g:
            g.wait_live()
            g.wait_ready(2)
            seen = urls(g)
            assert set(seen) == {up, ud}, seen
            assert seen[up]["worker_type"] == "prefill"
            assert seen[up]["bootstrap_port"] == 9150
            assert seen[ud]["worker_type"] == "decode"
            assert seen[ud]["bootstrap_port"] is None
            r = g.post("/v1/completions", {"model": "sim-model",
                                           "prompt": "hello world",
                                           "max_tokens": 3})
            assert r.status == 200, r
            assert r.headers["x-sim-worker"] == "D0"
            api.delete("d0")
            within(lambda: set(urls(g)) == {up}, "decode pod deleted")
            g.stop()
    finally:
        api.close()
        for p in sims:
            p.stop()


def test_discovery_epd(tmp_path):
    """--encode-selector: encode pods join as encode workers, with their
    bootstrap port, and a request takes encode -> prefill -> decode."""
    port = util.free_port()
    rdv = tmp_path / "rdv"
    rdv.mkdir()
    api = FakeK8s()
    sims = []
    try:
        sims.append(start_pod_sim(
            tmp_path, "127.0.0.4", port, "encode0", "--role", "encode",
            "--bootstrap-port", 9350, "--bootstrap-dir", rdv,
            "--worker-id", "E0"))
        ue = f"http://127.0.0.4:{port}"
        api.add("e0", {"app": "sglang", "role": "encode"}, "127.0.0.4",
                annotations={"sglang.ai/bootstrap-port": "9350"})
        up, ud = start_pd_pods(tmp_path, api, port, rdv, sims, 9351,
                               "--bootstrap-timeout", 2)
        with gw.start_gateway(
                tmp_path, "--service-discovery", "--epd-disaggregation",
                "--prefill-selector", "app=sglang", "role=prefill",
                "--decode-selector", "app=sglang", "role=decode",
                "--encode-selector", "app=sglang", "role=encode",
                "--service-discovery-port", port,
                "--service-discovery-namespace", NS,
                "--policy", "round_robin",
                env=gateway_env(tmp_path, api)) as g:
            g.wait_live()
            g.wait_ready(3)
            seen = urls(g)
            assert set(seen) == {ue, up, ud}, seen
            assert seen[ue]["worker_type"] == "encode"
            assert seen[ue]["bootstrap_port"] == 9350
            assert seen[up]["worker_type"] == "prefill"
            r = g.post("/v1/chat/completions", {
                "model": "sim-model",
                "messages": [{"role": "user", "content": "describe it"}],
                "max_tokens": 2})
            assert r.status == 200, r
            assert r.headers["x-sim-worker"] == "D0"
            conn = http.client.HTTPConnection("127.0.0.4", port, timeout=2)
            conn.request("GET", "/sim/stats")
            es = json.loads(conn.getresponse().read())["bootstrap"]
            conn.close()
            assert es["published"] == 1, es  # the encode leg ran
            api.delete("e0")
            within(lambda: set(urls(g)) == {up, ud}, "encode pod deleted")
            g.stop()
    finally:
        api.close()
        for p in sims:
            p.stop()


def test_discovery_needs_an_api(tmp_path):
    """Outside a pod and without SMG_K8S_API the gateway refuses to start
    (rather than serve with no worker ever found); plain http to an API
    off loopback is refused too."""
    import subprocess
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBERNETES_SERVICE_HOST", "SMG_K8S_API")}
    r = subprocess.run([util.binary("smg"), "--service-discovery",
                        "--selector", "app=x", "--run-dir",
                        str(tmp_path / "run")],
                       capture_output=True, text=True, env=env,
                       timeout=20 * util.TIMEOUT_MULT)
    assert r.returncode == 2, r
    assert "no Kubernetes API" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    env["SMG_K8S_API"] = "http://10.0.0.1:8080"
    r = subprocess.run([util.binary("smg"), "--service-discovery",
                        "--selector", "app=x", "--run-dir",
                        str(tmp_path / "run")],
                       capture_output=True, text=True, env=env,
                       timeout=20 * util.TIMEOUT_MULT)
    assert r.returncode == 2, r
    assert "SMG_K8S_API" in r.stderr and "loopback" in r.stderr, r.stderr
