"""The poller's gRPC side (workers.md §4-§5) against smg-simworker's gRPC
surface (--grpc-port, nghttp2): engine detection and health of grpc://
workers, GetLoads driving least_load, SubscribeKvEvents driving
cache_aware's event mode, a killed gRPC server that comes back, grpcs://
with a test CA, the --grpc-fault failures, and the 501 of inference routed
to a gRPC-only worker."""
import re
import threading
import time

import gw
import sim
import util

MODEL = "sim-model"
PAGE = 16
PREFIX = list(range(3000, 3000 + 24 * PAGE))      # 24 full blocks


def gen(ids, **kw):
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 2},
            **kw}


def grpc_sim(tmp_path, *args, grpc_port=None, port=None):
    gp = grpc_port or util.free_port()
    extra = ["--port", str(port)] if port else []
    w = sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0",
                            "--grpc-port", gp, *extra, *args)
    w.grpc_port = gp
    w.grpc_url = f"grpc://127.0.0.1:{gp}"
    return w


def grpc_reports(g, url):
    """Load reports of worker url that came over gRPC (debug log)."""
    return re.findall(r"load_report: " + re.escape(url)
                      + r" via grpc: (\d+) rank\(s\), waiting (\d+), "
                      r"running (\d+)", g.log())


def held_blocks(g, url):
    found = re.findall(r"kvindex_handle: " + re.escape(url)
                       + r": batch \d+[^,]*, \d+ events; model \S+ holds "
                       r"(\d+) blocks", g.log())
    return int(found[-1]) if found else None


def test_grpc_workers_register_report_and_refuse_inference(tmp_path):
    a = grpc_sim(tmp_path)
    b = grpc_sim(tmp_path, "--engine", "vllm")
    try:
        with gw.start_gateway(tmp_path, "--policy", "least_load",
                              "--worker-urls", a.grpc_url, b.grpc_url,
                              "--load-monitor-interval", "1",
                              "--health-check-interval-secs", "1",
                              "--log-level", "debug") as g:
            g.wait_ready(2)
            log = g.log()
            # Detection tries each service's HealthCheck (§4).
            assert (f"{a.grpc_url} serves "
                    "sglang.grpc.scheduler.SglangScheduler") in log, log
            assert f"{b.grpc_url} serves vllm.grpc.engine.VllmEngine" in log
            util.wait_for(lambda: grpc_reports(g, a.grpc_url)
                          and grpc_reports(g, b.grpc_url),
                          what="GetLoads reports of both")
            # Health probes by HealthCheck keep them Ready.
            time.sleep(2.5)
            ws = g.get("/workers").json()["workers"]
            assert sorted(w["status"] for w in ws) == ["Ready", "Ready"], ws
            # Inference cannot go to a gRPC-only worker: a clear 501.
            r = g.post("/v1/completions", {"model": MODEL, "prompt": "hi",
                                           "max_tokens": 2})
            assert r.status == 501, r
            assert b"grpc_inference_not_implemented" in r.body, r
            assert b"tokenize" in r.body, r
            # /flush_cache reaches them as FlushCache: SGLang serves it,
            # vLLM's service has none.
            r = g.post("/flush_cache", {})
            assert r.status == 206, r
            j = r.json()
            assert j["workers_flushed"] == 1, j
            assert j["total_grpc_workers"] == 2, j
            assert j["failed"][0]["worker"] == b.grpc_url, j
            assert "UNIMPLEMENTED" in j["failed"][0]["error"], j
            g.stop()
    finally:
        a.stop()
        b.stop()


def test_least_load_follows_grpc_loads(tmp_path):
    """HTTP workers without /v1/loads whose loads come from their gRPC
    side channel: the busy one (KV nearly full of long requests sent to
    it directly) gets at most 10% of the gateway's traffic."""
    idle = grpc_sim(tmp_path, "--no-loads")
    busy_grpc = util.free_port()
    busy = sim.start_simworker(tmp_path, "--model", MODEL, "--no-loads",
                               "--grpc-port", busy_grpc,
                               "--kv-capacity", "20000",
                               "--decode-base-ms", "20")
    stop = threading.Event()

    def hog():
        body = {"model": MODEL, "prompt": "lorem ipsum " * 330,
                "max_tokens": 1700}
        while not stop.is_set():
            try:
                util.post(busy.port, "/v1/completions", body, timeout=120)
            except Exception:
                return
    hogs = [threading.Thread(target=hog, daemon=True) for _ in range(10)]
    try:
        with gw.start_gateway(tmp_path, "--policy", "least_load",
                              "--load-monitor-interval", "1",
                              "--log-level", "debug") as g:
            for w, gp in ((idle, idle.grpc_port), (busy, busy_grpc)):
                r = g.post("/workers", {
                    "url": w.url,
                    "labels": {"grpc_endpoint": f"grpc://127.0.0.1:{gp}"}})
                assert r.status in (200, 201, 202), r
            g.wait_ready(2)
            for t in hogs:
                t.start()
            util.wait_for(lambda: any(int(run) >= 8 for _, _, run in
                                      grpc_reports(g, busy.url)),
                          timeout=20, what="the busy worker's gRPC report")
            util.wait_for(lambda: grpc_reports(g, idle.url),
                          what="the idle worker's gRPC report")
            seen = {idle.url: 0, busy.url: 0}
            for i in range(20):
                r = g.post("/v1/completions",
                           {"model": MODEL, "prompt": f"q{i}",
                            "max_tokens": 2}, timeout=60)
                assert r.status == 200, r
                seen[r.headers["x-smg-routed-worker-id"]] += 1
            assert seen[idle.url] >= 18, seen
            # /v1/loads is 404 on both: the figures came over gRPC only.
            assert "/v1/loads absent" not in g.log()
            g.stop()
    finally:
        stop.set()
        idle.stop()
        busy.stop()


def test_cache_aware_follows_grpc_kv_events(tmp_path):
    a = grpc_sim(tmp_path)
    b = grpc_sim(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--log-level", "debug") as g:
            for w in (a, b):
                r = g.post("/workers", {
                    "url": w.url, "labels": {"grpc_endpoint": w.grpc_url}})
                assert r.status in (200, 201, 202), r
            g.wait_ready(2)
            util.wait_for(lambda: len(re.findall(
                r"subscribed to KV events on grpc://127\.0\.0\.1:(?:%d|%d)"
                % (a.grpc_port, b.grpc_port), g.log())) >= 2,
                timeout=15, what="both gRPC subscriptions")
            # A's engine stores the prefix; its events reach the index.
            r = util.post(a.port, "/generate", gen(PREFIX))
            assert r.status == 200, r
            util.wait_for(lambda: (held_blocks(g, a.url) or 0) >= 24,
                          what="A's blocks in the index")
            for i in range(20):
                r = g.post("/generate", gen(PREFIX + [5, 6, 7]))
                assert r.status == 200, r
                assert r.headers["x-smg-routed-worker-id"] == a.url, i
            g.stop()
    finally:
        a.stop()
        b.stop()


def test_killed_grpc_server_resubscribes(tmp_path):
    """A's process (HTTP and gRPC) is killed mid-stream and restarted on
    the same ports: the poller logs the loss once, retries with backoff,
    resubscribes, and B's load reports keep coming meanwhile."""
    a_port, a_grpc = util.free_port(), util.free_port()
    a = grpc_sim(tmp_path, port=a_port, grpc_port=a_grpc)
    b = grpc_sim(tmp_path)
    a2 = None
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--load-monitor-interval", "1",
                              "--log-level", "debug") as g:
            for w in (a, b):
                r = g.post("/workers", {
                    "url": w.url, "labels": {"grpc_endpoint": w.grpc_url}})
                assert r.status in (200, 201, 202), r
            g.wait_ready(2)
            sub = r"subscribed to KV events on " + re.escape(a.grpc_url)
            util.wait_for(lambda: re.search(sub, g.log()), timeout=15,
                          what="A's subscription")
            a.proc.kill()
            util.wait_for(lambda: "KV event stream ended" in g.log(),
                          what="the stream's end logged")
            before = len(grpc_reports(g, b.url))
            time.sleep(4)
            # B kept reporting every second while A was gone.
            assert len(grpc_reports(g, b.url)) - before >= 3
            a2 = sim.start_simworker(tmp_path, "--model", MODEL,
                                     "--time-scale", "0",
                                     "--grpc-port", a_grpc,
                                     "--port", a_port, name="a_again")
            util.wait_for(lambda: len(re.findall(sub, g.log())) >= 2,
                          timeout=40, what="A's resubscription")
            log = g.log()
            # The channel's loss was logged at info once.
            lost = re.findall(re.escape(a.grpc_url) + r": [^\n]*; "
                              r"reconnecting in", log)
            assert len(lost) == 1, lost
            assert len(re.findall("KV event stream ended", log)) == 1
            # The restarted engine's events drive routing again.
            r = util.post(a_port, "/generate", gen(PREFIX))
            assert r.status == 200, r
            util.wait_for(lambda: (held_blocks(g, a.url) or 0) >= 24,
                          what="A's new blocks in the index")
            g.wait_ready(2, timeout=30)
            r = g.post("/generate", gen(PREFIX + [1]))
            assert r.headers["x-smg-routed-worker-id"] == a.url
            g.stop()
    finally:
        if a2 is not None:
            a2.stop()
        a.proc.kill()
        b.stop()


def test_grpcs_with_a_test_ca(tmp_path):
    from test_datapath_tls import make_pki
    d = tmp_path / "pki"
    d.mkdir()
    pki = make_pki(d)
    gp = util.free_port()
    w = sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0",
                            "--grpc-port", gp, "--grpc-tls-cert",
                            pki["cert"], "--grpc-tls-key", pki["key"])
    url = f"grpcs://localhost:{gp}"
    try:
        with gw.start_gateway(tmp_path, "--policy", "least_load",
                              "--worker-urls", url,
                              "--ca-cert-paths", pki["ca"],
                              "--load-monitor-interval", "1",
                              "--log-level", "debug") as g:
            g.wait_ready(1)
            util.wait_for(lambda: grpc_reports(g, url),
                          what="a GetLoads report over TLS")
            g.stop()
    finally:
        w.stop()


def test_grpc_faults_and_unimplemented_events(tmp_path):
    """Each fault fails its worker with a clear log line and holds up
    nobody else; an engine without KV events leaves cache_aware in tree
    mode with one log line."""
    unavail = grpc_sim(tmp_path, "--grpc-fault", "unavailable")
    reset = grpc_sim(tmp_path, "--grpc-fault", "reset")
    slow = grpc_sim(tmp_path, "--grpc-fault", "slow")
    noev = grpc_sim(tmp_path, "--grpc-kv-events", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--worker-urls", unavail.grpc_url,
                              reset.grpc_url, slow.grpc_url, noev.grpc_url,
                              "--health-check-timeout-secs", "1",
                              "--load-monitor-interval", "1",
                              "--log-level", "debug") as g:
            g.wait_ready(1)
            util.wait_for(lambda: grpc_reports(g, noev.grpc_url),
                          what="the healthy worker's reports")
            util.wait_for(lambda: "SubscribeKvEvents unimplemented"
                          in g.log(), what="the tree-mode line")
            util.wait_for(lambda: all(s in g.log() for s in (
                "UNAVAILABLE: simulated: unavailable",
                "stream reset by the server",
                "DEADLINE_EXCEEDED: deadline of 1.0 s exceeded")),
                timeout=20, what="each fault's log line")
            time.sleep(2)
            assert g.log().count("SubscribeKvEvents unimplemented") == 1
            ws = {w["url"]: w["status"] for w in
                  g.get("/workers").json()["workers"]}
            assert ws[noev.grpc_url] == "Ready", ws
            for w in (unavail, reset, slow):
                assert ws[w.grpc_url] != "Ready", ws
            g.stop()
    finally:
        for w in (unavail, reset, slow, noev):
            w.stop()
