"""Frontend groups on other hosts share one broker (--broker-listen,
--broker tcp://).

A "host" is a run dir of its own: its frontends map their own shared
memory, and reach the broker of group A only over tcp:// on loopback.
The remote group mirrors the worker table (pushed: a long poll the
broker answers when the table changes), routes through the shared
broker (a prefix warmed through A is found through B), sees a worker
added through its own API, and loses no request when the broker is
killed under load (the local fallback on the mirrored table), and keeps
serving through a partition of its link, then rejoins. `smg --broker`
starts a frontend-only host; tls+tcp:// needs the broker's trust.
"""
import json
import os
import re
import select
import signal
import socket
import subprocess
import threading
import time

import gw
import sim
import util

MODEL = "sim-model"
PREFIX = ("Shared system text for the whole fleet. " * 60)


class RemoteGroup:
    """smg-frontend processes with their own run dir and --broker URL."""

    def __init__(self, tmp_path, broker_url, n=1, name="hostB", extra=()):
        self.run_dir = str(tmp_path / name / "run")
        self.state_dir = str(tmp_path / name / "state")
        os.makedirs(self.run_dir, mode=0o700)
        os.makedirs(self.state_dir, mode=0o700)
        self.port = util.free_port()
        self.metrics_port = util.free_port()
        self.procs = []
        for slot in range(n):
            argv = [util.binary("smg-frontend"), "--host", "127.0.0.1",
                    "--port", str(self.port),
                    "--prometheus-host", "127.0.0.1",
                    "--prometheus-port", str(self.metrics_port),
                    "--run-dir", self.run_dir,
                    "--state-dir", self.state_dir,
                    "--frontends", str(n), "--frontend-slot", str(slot),
                    "--broker", broker_url, *extra]
            self.procs.append(util.Proc(f"{name}-fe{slot}", argv, tmp_path))

    def get(self, path, **kw):
        return util.get(self.port, path, **kw)

    def post(self, path, body=None, **kw):
        return util.post(self.port, path, body=body, **kw)

    def models(self):
        r = self.get("/v1/models", timeout=2)
        return [m["id"] for m in r.json().get("data", [])] \
            if r.status == 200 else []

    def log(self):
        return "".join(p.log() for p in self.procs)

    def stop(self, check=True):
        for p in self.procs:
            p.stop(signal.SIGTERM, check=check)

    def kill(self):
        for p in self.procs:
            p.kill()


def metric(target, name):
    body = util.get(target.metrics_port, "/metrics").body.decode()
    m = re.search(r"^" + re.escape(name) + r"(?:\{\})? (\d+)", body, re.M)
    return int(m.group(1)) if m else 0


def broker_load(g):
    """In-flight requests the broker counts, over all workers."""
    r = g.get("/workers", timeout=2)
    return sum(w.get("load", 0) for w in r.json().get("workers", []))


def mirrored_urls(g):
    """Worker URLs of B's own shared memory, through its fallback-facing
    endpoint (/v1/models lists models; /readiness counts workers)."""
    r = g.get("/readiness", timeout=2)
    return r.json().get("healthy_workers", 0) if r.status == 200 else 0


def completion(target, suffix, timeout=10):
    return target.post("/v1/completions",
                       {"model": MODEL, "prompt": PREFIX + suffix,
                        "max_tokens": 2}, timeout=timeout)


def test_remote_group_shares_the_broker(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(3)]
    bport = util.free_port()
    burl = f"tcp://127.0.0.1:{bport}"
    b = None
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--worker-urls", ws[0].url, ws[1].url,
                              "--broker-listen", burl) as g:
            g.wait_ready(2)
            b = RemoteGroup(tmp_path, burl)
            # The worker table reaches B's own shared memory.
            util.wait_for(lambda: mirrored_urls(b) >= 2, timeout=15,
                          what="B mirrors two ready workers")
            assert MODEL in b.models()
            # A plain libnng REQ socket over tcp:// gets decisions.
            p = subprocess.run([util.binary("smg-nngreq"), burl, "",
                                "one", "two"], capture_output=True,
                               text=True, timeout=30)
            assert p.returncode == 0, p.stderr
            out = [json.loads(x) for x in p.stdout.splitlines()]
            assert len(out) == 2 and all(d["status"] == "ok" for d in out)
            # A warms a prefix; B's request with it lands on that worker.
            r = completion(g, " first question?")
            assert r.status == 200, r
            warmed = r.headers["x-smg-routed-worker-id"]
            for i in range(5):
                r = completion(b, f" question {i} from B?")
                assert r.status == 200, r
                assert r.headers["x-smg-routed-worker-id"] == warmed, \
                    (i, r.headers, warmed)
            # B's decisions came from the broker, not its fallback.
            assert metric(b, "smg_broker_fallback_decisions_total") == 0
            # A worker added through B's API is in both groups' tables
            # within 1 s of the answer.
            r = b.post("/workers", {"url": ws[2].url})
            assert r.status in (200, 201, 202), r
            t0 = time.monotonic()

            def listed(target):
                rr = target.get("/workers", timeout=2)
                return rr.status == 200 and any(
                    w.get("url") == ws[2].url
                    for w in rr.json().get("workers", []))
            util.wait_for(lambda: listed(g) and listed(b), timeout=1.0,
                          interval=0.02, what="the new worker listed")
            took = time.monotonic() - t0
            assert took < 1.0, took
            # Routable: Ready in A's shared memory (the broker's own
            # host) and in B's mirror, B no more than 1 s after A.
            seen = {}
            end = time.monotonic() + 15 * util.TIMEOUT_MULT
            while len(seen) < 2 and time.monotonic() < end:
                for name, target in (("A", g), ("B", b)):
                    if name not in seen and mirrored_urls(target) >= 3:
                        seen[name] = time.monotonic()
                time.sleep(0.01)
            assert len(seen) == 2, seen
            assert seen["B"] - seen["A"] < 1.0, seen
            b.stop()
            b = None
            g.stop()
    finally:
        if b is not None:
            b.kill()
        for w in ws:
            w.stop()


def pushed_latency(g, x, n, what):
    """Seconds from the broker's host (A) counting n ready workers to the
    remote group x's mirror counting them too: the table push."""
    seen = {}
    end = time.monotonic() + 20 * util.TIMEOUT_MULT
    while len(seen) < 2 and time.monotonic() < end:
        for name, target in (("A", g), ("X", x)):
            if name not in seen and mirrored_urls(target) >= n:
                seen[name] = time.monotonic()
        time.sleep(0.005)
    assert len(seen) == 2, (what, seen)
    took = seen["X"] - seen["A"]
    print(f"{what}: in the remote mirror {took * 1000:.0f} ms after "
          f"the broker's host")
    return took


def test_table_pushed_to_other_groups(tmp_path):
    """A worker added through group B reaches group C's mirror (a long
    poll the broker answers when the table changes), C routes to it, and
    the long poll survives the broker being killed while it holds it."""
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(4)]
    bport = util.free_port()
    burl = f"tcp://127.0.0.1:{bport}"
    groups = []
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", ws[0].url, ws[1].url,
                              "--broker-listen", burl) as g:
            g.wait_ready(2)
            b = RemoteGroup(tmp_path, burl, name="hostB")
            groups.append(b)
            c = RemoteGroup(tmp_path, burl, name="hostC")
            groups.append(c)
            for x in groups:
                util.wait_for(lambda: mirrored_urls(x) >= 2, timeout=15,
                              what="a remote group mirrors two workers")
            # Idle for longer than a held wait lasts: the waits are
            # renewed ("unchanged") and the mirror stays as it is.
            time.sleep(6.0)
            assert mirrored_urls(c) == 2
            r = b.post("/workers", {"url": ws[2].url})
            assert r.status in (200, 201, 202), r
            assert pushed_latency(g, c, 3, "worker added through B") < 1.0
            ids = set()
            for i in range(6):
                r = c.post("/generate", {"text": f"to the new one {i}"})
                assert r.status == 200, r
                ids.add(r.headers["x-smg-routed-worker-id"])
            assert ws[2].url in ids, ids
            assert metric(c, "smg_broker_fallback_decisions_total") == 0
            # The broker dies while it holds both mirrors' waits; the
            # launcher restarts it and the waits start over.
            broker = g.pids()["broker"][0]
            os.kill(broker, signal.SIGKILL)

            def new_broker():
                now = g.pids()["broker"]
                return bool(now) and now[0] != broker
            util.wait_for(new_broker, timeout=20, what="a new broker")

            def added():
                r = b.post("/workers", {"url": ws[3].url}, timeout=2)
                # 409: an earlier try got through after all.
                return r.status in (200, 201, 202, 409) or None
            util.wait_for(added, timeout=20, interval=0.1,
                          what="B adds a worker through the new broker")
            assert pushed_latency(g, c, 4,
                                  "worker added after a broker restart") \
                < 1.0
            for x in groups:
                x.stop()
            groups = []
            g.stop()
    finally:
        for x in groups:
            x.kill()
        for w in ws:
            w.stop()


def test_broker_killed_under_remote_load(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(2)]
    bport = util.free_port()
    burl = f"tcp://127.0.0.1:{bport}"
    groups = []
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--worker-urls", ws[0].url, ws[1].url,
                              "--broker-listen", burl) as g:
            g.wait_ready(2)
            # Two remote groups of two frontends each.
            groups = [RemoteGroup(tmp_path, burl, n=2, name=name)
                      for name in ("hostB", "hostC")]
            for x in groups:
                util.wait_for(lambda: mirrored_urls(x) >= 2, timeout=15,
                              what="a remote group mirrors two workers")
            stop = threading.Event()
            results = []
            lock = threading.Lock()

            def load(x, k):
                i = 0
                while not stop.is_set():
                    try:
                        r = completion(x, f" load {k} {i}", timeout=20)
                        st = r.status
                    except Exception as e:  # a failed request counts
                        st = repr(e)
                    with lock:
                        results.append(st)
                    i += 1
            threads = [threading.Thread(target=load, args=(x, k))
                       for x in groups for k in range(3)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            broker = g.pids()["broker"][0]
            os.kill(broker, signal.SIGKILL)
            # The launcher restarts it; the groups reconnect over tcp://.
            def new_broker():
                now = g.pids()["broker"]  # read once: it may be empty
                return bool(now) and now[0] != broker
            util.wait_for(new_broker, timeout=20, what="a new broker")
            time.sleep(2.0)
            stop.set()
            for t in threads:
                t.join(timeout=60)
            failed = [s for s in results if s != 200]
            assert len(results) > 50, len(results)
            assert not failed, failed[:10]
            # Both groups are back on the (restarted) broker: a prompt
            # warmed through one lands on the same worker through the
            # other, which only the broker's tree can tell.
            fb = [metric(x, "smg_broker_fallback_decisions_total")
                  for x in groups]
            print(f"{len(results)} requests, 0 failed, fallback "
                  f"decisions per group {fb}")
            r = completion(groups[0], " after the restart")
            assert r.status == 200, r
            r2 = completion(groups[1], " after the restart")
            assert r2.status == 200, r2
            assert r.headers["x-smg-routed-worker-id"] == \
                r2.headers["x-smg-routed-worker-id"]
            assert [metric(x, "smg_broker_fallback_decisions_total")
                    for x in groups] == fb
            for x in groups:
                x.stop()
            groups = []
            g.stop()
    finally:
        for x in groups:
            x.kill()
        for w in ws:
            w.stop()


def test_remote_load_reaches_the_broker(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(2)]
    bport = util.free_port()
    burl = f"tcp://127.0.0.1:{bport}"
    b = None
    try:
        with gw.start_gateway(tmp_path, "--policy", "least_load",
                              "--worker-urls", ws[0].url, ws[1].url,
                              "--broker-listen", burl) as g:
            g.wait_ready(2)
            b = RemoteGroup(tmp_path, burl)
            util.wait_for(lambda: mirrored_urls(b) >= 2, timeout=15,
                          what="B mirrors two ready workers")
            assert broker_load(g) == 0

            def held(i):
                try:
                    b.post("/v1/completions",
                           {"model": MODEL, "prompt": f"hold {i}",
                            "max_tokens": 2, "sim_hold_ms": 4000},
                           timeout=30)
                except Exception:
                    pass  # B is killed under them below
            threads = [threading.Thread(target=held, args=(i,))
                       for i in range(4)]
            for t in threads:
                t.start()
            # Only B's own shared memory holds them: the broker sums
            # what B reports.
            util.wait_for(lambda: broker_load(g) == 4, timeout=5,
                          what="B's four requests counted by the broker")
            # B dies with them in flight: forgotten after 3 intervals.
            b.kill()
            t0 = time.monotonic()
            util.wait_for(lambda: broker_load(g) == 0, timeout=5,
                          interval=0.02, what="B's load forgotten")
            assert time.monotonic() - t0 < 1.0
            for t in threads:
                t.join(timeout=30)
            b = None
            g.stop()
    finally:
        if b is not None:
            b.kill()
        for w in ws:
            w.stop()


def make_certs(d):
    """A CA, the broker's certificate for localhost, a frontend's, and a
    frontend certificate from another CA."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]

    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True,
                       capture_output=True)
    ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt",
         "-subj", "/CN=fleet-ca", "-days", "2")
    ossl("req", "-x509", *ec, "-keyout", "other.key", "-out", "other.crt",
         "-subj", "/CN=other-ca", "-days", "2")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost\n")
    for name, cn, ca in (("brain", "localhost", "ca"),
                         ("fe", "frontend", "ca"),
                         ("stranger", "frontend", "other")):
        ossl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={cn}")
        ossl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt",
             "-CAkey", f"{ca}.key", "-set_serial", str(len(name)),
             "-days", "2", "-extfile", "ext.cnf", "-out", f"{name}.crt")
    return {n: os.path.join(d, n) for n in os.listdir(d)}


def test_remote_group_over_mutual_tls(tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    c = make_certs(str(certs))
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(3)]
    bport = util.free_port()
    b = bad = None
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--worker-urls", ws[0].url, ws[1].url,
                              "--broker-listen",
                              f"tls+tcp://127.0.0.1:{bport}",
                              "--broker-tls-cert", c["brain.crt"],
                              "--broker-tls-key", c["brain.key"],
                              "--broker-tls-ca", c["ca.crt"]) as g:
            g.wait_ready(2)
            url = f"tls+tcp://localhost:{bport}"
            b = RemoteGroup(tmp_path, url, extra=(
                "--broker-tls-cert", c["fe.crt"],
                "--broker-tls-key", c["fe.key"],
                "--broker-tls-ca", c["ca.crt"]))
            bad = RemoteGroup(tmp_path, url, name="hostC", extra=(
                "--broker-tls-cert", c["stranger.crt"],
                "--broker-tls-key", c["stranger.key"],
                "--broker-tls-ca", c["ca.crt"]))
            util.wait_for(lambda: mirrored_urls(b) >= 2, timeout=15,
                          what="B mirrors two ready workers over TLS")
            r = completion(g, " warm over TLS")
            assert r.status == 200, r
            warmed = r.headers["x-smg-routed-worker-id"]
            r = completion(b, " through B over TLS")
            assert r.status == 200, r
            assert r.headers["x-smg-routed-worker-id"] == warmed
            assert metric(b, "smg_broker_fallback_decisions_total") == 0
            # The table wait B's mirror holds is answered over TLS too.
            r = b.post("/workers", {"url": ws[2].url})
            assert r.status in (200, 201, 202), r
            assert pushed_latency(g, b, 3, "worker added over TLS") < 1.0
            # A frontend whose certificate the broker does not trust gets
            # nothing from it: no table, and its worker API is refused.
            time.sleep(1.0)
            assert mirrored_urls(bad) == 0
            assert bad.models() == []
            r = bad.post("/workers", {"url": "http://127.0.0.1:1"})
            assert r.status == 503, r
            bad.stop()
            bad = None
            b.stop()
            b = None
            g.stop()
    finally:
        for x in (b, bad):
            if x is not None:
                x.kill()
        for w in ws:
            w.stop()


def test_launcher_runs_a_frontend_only_host(tmp_path):
    """smg --broker URL: only frontends on this host, none of its own
    broker or poller; it serves through the shared broker."""
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")]
    bport = util.free_port()
    burl = f"tcp://127.0.0.1:{bport}"
    host = tmp_path / "hostL"
    host.mkdir()
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", ws[0].url,
                              "--broker-listen", burl) as g:
            g.wait_ready(1)
            with gw.start_gateway(host, "--broker", burl,
                                  frontends=2) as h:
                h.wait_ready(1)
                util.wait_for(lambda: len(h.pids()["frontend"]) == 2,
                              what="two frontends")
                assert h.pids()["broker"] == [] and \
                    h.pids()["poller"] == [], h.pids()
                r = h.post("/generate", {"text": "hi"})
                assert r.status == 200, r
                assert r.headers["x-smg-routed-worker-id"] == ws[0].url
                assert metric(h, "smg_broker_fallback_decisions_total") \
                    == 0
                h.stop()
            g.stop()
    finally:
        for w in ws:
            w.stop()


class Partition:
    """A TCP relay between a remote group and the broker that can stop
    carrying bytes both ways (a network partition: nothing is closed,
    nothing arrives) and carry them again."""

    def __init__(self, target_port):
        self.target = target_port
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self.open = threading.Event()
        self.open.set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        pairs = {}
        while not self.stop.is_set():
            socks = [self.lsock] + (list(pairs) if self.open.is_set()
                                    else [])
            r, _, _ = select.select(socks, [], [], 0.02)
            for s in r:
                if s is self.lsock:
                    c, _ = s.accept()
                    u = socket.create_connection(("127.0.0.1",
                                                  self.target))
                    pairs[c], pairs[u] = u, c
                    continue
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                peer = pairs.get(s)
                if not data or peer is None:
                    for x in (s, peer):
                        if x is not None:
                            pairs.pop(x, None)
                            x.close()
                    continue
                peer.sendall(data)
        for x in list(pairs) + [self.lsock]:
            x.close()

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)


def test_partitioned_group_fails_open_and_rejoins(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(2)]
    bport = util.free_port()
    part = None
    b = None
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--worker-urls", ws[0].url, ws[1].url,
                              "--broker-listen",
                              f"tcp://127.0.0.1:{bport}") as g:
            g.wait_ready(2)
            part = Partition(bport)
            b = RemoteGroup(tmp_path, f"tcp://127.0.0.1:{part.port}")
            util.wait_for(lambda: mirrored_urls(b) >= 2, timeout=15,
                          what="B mirrors two ready workers")
            r = completion(b, " before")
            assert r.status == 200, r
            assert metric(b, "smg_broker_fallback_decisions_total") == 0
            part.open.clear()  # partitioned
            statuses = [completion(b, f" cut off {i}").status
                        for i in range(20)]
            assert statuses == [200] * 20, statuses
            during = metric(b, "smg_broker_fallback_decisions_total")
            assert during >= 1, during
            part.open.set()  # healed: B goes back to the broker

            def rejoined():
                before = metric(b, "smg_broker_fallback_decisions_total")
                r = completion(b, " rejoined")
                return r.status == 200 and metric(
                    b, "smg_broker_fallback_decisions_total") == before
            util.wait_for(rejoined, timeout=10, interval=0.05,
                          what="B deciding through the broker again")
            print(f"{during} fallback decisions while partitioned")
            b.stop()
            b = None
            g.stop()
    finally:
        if part is not None:
            part.close()
        if b is not None:
            b.kill()
        for w in ws:
            w.stop()
