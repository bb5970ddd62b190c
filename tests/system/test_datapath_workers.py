"""The worker API through the gateway, and a broker killed under load.

POST/GET/DELETE /workers answer with the shapes of gateway.md §3.3; a
broker killed with SIGKILL while clients send requests fails none of them
(the frontend routes locally until the launcher's new broker answers), and
the new broker knows every worker from LMDB, the one added through
POST /workers included.
"""
import http.client
import json
import os
import re
import signal
import threading
import time

import gw
import sim
import util

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}
INFO_FIELDS = ("id", "url", "model_id", "worker_type", "connection_mode",
               "labels", "priority", "cost", "is_healthy", "status", "load",
               "job_status")


def wait_status(g, wid, status, timeout=10.0):
    def check():
        r = g.get(f"/workers/{wid}", timeout=2)
        return r.status == 200 and r.json()["status"] == status
    util.wait_for(check, timeout=timeout, what=f"worker {wid} {status}")


def test_worker_api(tmp_path):
    w1 = sim.start_simworker(tmp_path, "--time-scale", "0")
    w2 = sim.start_simworker(tmp_path, "--time-scale", "0", "--engine",
                             "vllm", "--model", "other-model")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w1.url,
                              "--drain-settle-secs", "1") as g:
            g.wait_ready(1)

            # POST: 202 + Location, the accepted body.
            r = g.post("/workers", {"url": w2.url, "labels": {"tier": "b"},
                                    "api_key": "secret-key"})
            assert r.status == 202, r
            body = r.json()
            wid = body["worker_id"]
            assert r.headers["location"] == f"/workers/{wid}"
            assert body == {"status": "accepted", "worker_id": wid,
                            "url": w2.url, "location": f"/workers/{wid}",
                            "message": "Worker addition queued for background "
                                       "processing"}
            assert r.headers["content-type"] == "application/json"
            wait_status(g, wid, "Ready")

            # Validation errors: 400 with the worker-service error body.
            for bad in ({"url": "ftp://x"}, {"no_url": 1}, "not json",
                        ["x"], {"url": 5}):
                r = g.post("/workers", bad)
                assert r.status == 400, (bad, r)
                e = r.json()
                assert set(e) == {"error", "code"}, e
                assert e["error"] and e["code"]
            r = g.post("/workers", {"url": w2.url})
            assert r.status == 409 and "code" in r.json()

            # GET list, filtered list, one.
            r = g.get("/workers")
            assert r.status == 200
            lst = r.json()
            assert lst["total"] == 2
            assert lst["stats"] == {"prefill_count": 0, "decode_count": 0,
                                    "regular_count": 2}
            assert [x["url"] for x in lst["workers"]] == [w1.url, w2.url]
            for x in lst["workers"]:
                for f in INFO_FIELDS:
                    assert f in x, (f, x)
                assert "api_key" not in x
            one = g.get(f"/workers/{wid}").json()
            assert one["id"] == wid and one["url"] == w2.url
            assert one["model_id"] == "other-model"
            assert one["status"] == "Ready" and one["is_healthy"] is True
            assert one["labels"] == {"tier": "b"}
            assert "api_key" not in json.dumps(one)
            r = g.get("/workers?model=other-model").json()
            assert [x["id"] for x in r["workers"]] == [wid] and r["total"] == 1
            r = g.get("/workers/no-such-worker")
            assert r.status == 400 and r.json()["code"] == "BAD_REQUEST"
            r = g.get("/workers/0191e2a4-6b7c-7d3e-8f00-0123456789ab")
            assert r.status == 404 and r.json()["code"] == "WORKER_NOT_FOUND"

            # The added worker serves its model; the worker key is sent.
            r = g.post("/v1/completions", {"model": "other-model",
                                           "prompt": "hi", "max_tokens": 2})
            assert r.status == 200, r
            assert r.headers["x-smg-routed-worker-id"] == w2.url
            r = g.get("/v1/models").json()
            assert sorted(m["id"] for m in r["data"]) == ["other-model",
                                                          "sim-model"]

            # DELETE: 202, Draining, then gone; its model with it.
            r = g.request("DELETE", f"/workers/{wid}")
            assert r.status == 202, r
            assert r.json() == {"status": "accepted", "worker_id": wid,
                                "message": "Worker removal queued for "
                                           "background processing"}
            util.wait_for(lambda: g.get(f"/workers/{wid}").status == 404,
                          timeout=10, what="worker removed")
            assert g.get("/workers").json()["total"] == 1
            r = g.post("/v1/completions", {"model": "other-model",
                                           "prompt": "hi"})
            assert r.status == 404, r
            assert r.json()["error"]["code"] == "model_not_found"
            assert g.request("DELETE", "/workers/no-such").status == 400
            assert g.request("DELETE", f"/workers/{wid}").status == 404
            assert g.request("PATCH", "/workers").status in (400, 405)
            g.stop()
    finally:
        w1.stop()
        w2.stop()


class Load:
    """Client threads sending /generate back to back on keep-alive
    connections; every outcome other than 200 is kept as a failure."""

    def __init__(self, port, threads=3):
        self.port = port
        self.stop_flag = threading.Event()
        self.ok = 0
        self.failures = []
        self.by_worker = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True)
                        for _ in range(threads)]
        for t in self.threads:
            t.start()

    def run(self):
        body = json.dumps(GEN)
        conn = None
        deadline = time.monotonic() + 60  # bound even if never stopped
        while not self.stop_flag.is_set() and time.monotonic() < deadline:
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                      timeout=10)
                conn.request("POST", "/generate", body=body,
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                wurl = r.getheader("x-smg-routed-worker-id")
                with self.lock:
                    if r.status == 200:
                        self.ok += 1
                        self.by_worker[wurl] = self.by_worker.get(wurl, 0) + 1
                    else:
                        self.failures.append((r.status, data[:200]))
                if r.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                with self.lock:
                    self.failures.append(("exception", repr(e)))
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def finish(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(15)


def test_broker_kill_under_load(tmp_path):
    w1 = sim.start_simworker(tmp_path, "--time-scale", "0")
    w2 = sim.start_simworker(tmp_path, "--time-scale", "0")
    w3 = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w1.url, w2.url) as g:
            g.wait_ready(2)
            r = g.post("/workers", {"url": w3.url})
            assert r.status == 202, r
            wid = r.json()["worker_id"]
            wait_status(g, wid, "Ready")
            before = sorted((x["id"], x["url"])
                            for x in g.get("/workers").json()["workers"])
            assert len(before) == 3

            load = Load(g.port)
            try:
                for _ in range(2):
                    time.sleep(1.0)
                    old = g.pids()["broker"]
                    assert len(old) == 1
                    os.kill(old[0], signal.SIGKILL)
                    util.wait_for(lambda: g.pids()["broker"] not in ([], old),
                                  timeout=10, what="a new broker")
                # Keep the load on while the new broker takes over.
                util.wait_for(lambda: g.get("/workers", timeout=2).status == 200,
                              timeout=10, what="the new broker answering")
                time.sleep(1.0)
            finally:
                load.finish()
            assert load.failures == [], load.failures[:5]
            assert load.ok > 100, load.ok

            # The new broker knows every worker, the API-added one included,
            # and routes to all of them again.
            after = sorted((x["id"], x["url"])
                           for x in g.get("/workers").json()["workers"])
            assert after == before
            wait_status(g, wid, "Ready")
            seen = set()
            for _ in range(30):
                r = g.post("/generate", GEN)
                assert r.status == 200, r
                seen.add(r.headers["x-smg-routed-worker-id"])
            assert seen == {w1.url, w2.url, w3.url}
            assert "launcher_child_cb: smg-broker" in g.log()
            # The requests in the gap were routed by the local fallback.
            assert "routing locally" in g.log()
            m = re.search(r"^smg_broker_fallback_decisions_total(?:\{\})? (\d+)",
                          g.metrics(), re.M)
            assert m and int(m.group(1)) > 0
            g.stop()
    finally:
        for w in (w1, w2, w3):
            w.stop()
