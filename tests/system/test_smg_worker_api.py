"""SMG's worker API, checked as SMG's own tests and handlers define it
(model_gateway/src/worker/service.rs, tests/routing/
worker_management_test.rs): PUT applies the new spec
(test_replace_worker_applies_new_spec), PATCH merges, ids are UUID v7
and survive a restart, a malformed id is 400 BAD_REQUEST, an unknown one
404 WORKER_NOT_FOUND, a duplicate 409 WORKER_ALREADY_EXISTS; WorkerInfo
carries models, max_connection_attempts and provider; a WorkerSpec's
models[].aliases route to the model, whose id the worker receives.
"""
import re
import time

import gw
import sim
import util

UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}"
                   r"-[0-9a-f]{12}$")


def get_worker(g, wid):
    r = g.get(f"/workers/{wid}")
    assert r.status == 200, r
    return r.json()


def test_replace_worker_applies_new_spec(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            listed = g.get("/workers").json()
            worker = listed["workers"][0]
            wid, url = worker["id"], worker["url"]
            assert UUID7.match(wid), wid
            new_priority = worker["priority"] + 7
            r = g.request("PUT", f"/workers/{wid}",
                          body={"url": url, "priority": new_priority})
            assert r.status == 202, r
            assert r.json() == {"status": "accepted", "worker_id": wid,
                                "message": "Worker update queued for "
                                           "background processing"}
            util.wait_for(
                lambda: get_worker(g, wid)["priority"] == new_priority,
                timeout=4, what="PUT applied")
            assert get_worker(g, wid)["url"] == url
            # The URL cannot change through PUT.
            r = g.request("PUT", f"/workers/{wid}",
                          body={"url": "http://127.0.0.1:9"})
            assert r.status == 400 and r.json()["code"] == "BAD_REQUEST", r
            assert "URL mismatch" in r.json()["error"]
            # The worker still serves.
            assert g.post("/generate", {"text": "hi"}).status == 200
            g.stop()
    finally:
        w.stop()


def test_patch_worker_merges_labels(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin") as g:
            r = g.post("/workers", {"url": w.url, "labels": {"a": "1"}})
            assert r.status == 202, r
            wid = r.json()["worker_id"]
            g.wait_ready(1)
            r = g.request("PATCH", f"/workers/{wid}",
                          body={"labels": {"b": "2"}, "cost": 2.5})
            assert r.status == 202, r
            info = get_worker(g, wid)
            assert info["labels"] == {"a": "1", "b": "2"}
            assert info["cost"] == 2.5
            r = g.request("PATCH", f"/workers/{wid}", body={"priority": -1})
            assert r.status == 400 and r.json()["code"] == "BAD_REQUEST"
            g.stop()
    finally:
        w.stop()


def test_worker_ids_and_error_codes(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin") as g:
            r = g.post("/workers", {"url": w.url, "provider": "openai",
                                    "max_connection_attempts": 5})
            assert r.status == 202, r
            wid = r.json()["worker_id"]
            assert UUID7.match(wid), wid
            assert r.headers["location"] == f"/workers/{wid}"
            g.wait_ready(1)
            info = get_worker(g, wid)
            assert info["models"] == [{"id": "sim-model"}], info
            assert info["max_connection_attempts"] == 5
            assert info["provider"] == "openai"
            # Duplicate URL: 409 naming the existing id.
            r = g.post("/workers", {"url": w.url})
            assert r.status == 409, r
            assert r.json()["code"] == "WORKER_ALREADY_EXISTS"
            assert wid in r.json()["error"]
            # Malformed ids: 400 for every method; unknown UUID: 404.
            for method in ("GET", "DELETE", "PUT", "PATCH"):
                r = g.request(method, "/workers/not-a-uuid",
                              body={"url": w.url})
                assert r.status == 400, (method, r)
                e = r.json()
                assert e["code"] == "BAD_REQUEST", e
                assert "expected UUID" in e["error"], e
            other = "0191e2a4-6b7c-7d3e-8f00-0123456789ab"
            for method in ("GET", "DELETE", "PATCH"):
                r = g.request(method, f"/workers/{other}", body={})
                assert r.status == 404, (method, r)
                assert r.json() == {"error": f"Worker {other} not found",
                                    "code": "WORKER_NOT_FOUND"}
            # Invalid spec: 400 BAD_REQUEST.
            r = g.post("/workers", {"url": "ftp://x"})
            assert r.status == 400 and r.json()["code"] == "BAD_REQUEST"
            # A wrong method on the collection: 405 with Allow.
            r = g.request("PATCH", "/workers")
            assert r.status == 405 and "POST" in r.headers["allow"], r
            g.stop()
        # The id survives a restart (kept in the state dir).
        with gw.start_gateway(tmp_path, "--policy", "round_robin") as g:
            g.wait_ready(1)
            assert [x["id"] for x in g.get("/workers").json()["workers"]] \
                == [wid]
            g.stop()
    finally:
        w.stop()


def test_worker_spec_aliases_route_to_the_model(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0", "--engine",
                            "vllm", "--model", "org/canon", "--strict-model")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin") as g:
            r = g.post("/workers", {"url": w.url, "models": [
                {"id": "org/canon", "aliases": ["canon", "c-latest"]}]})
            assert r.status == 202, r
            g.wait_ready(1)
            for model in ("canon", "c-latest", "org/canon"):
                r = g.post("/v1/completions", {"model": model,
                                               "prompt": "hi",
                                               "max_tokens": 2})
                assert r.status == 200, (model, r)
                assert r.headers["x-smg-routed-worker-id"] == w.url
            r = g.post("/v1/chat/completions", {
                "model": "canon", "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]})
            assert r.status == 200, r
            r = g.post("/v1/completions", {"model": "nope", "prompt": "hi"})
            assert r.status == 404, r
            assert r.json()["error"]["code"] == "model_not_found"
            g.stop()
    finally:
        w.stop()


def test_pd_model_alias_applied_to_the_legs(tmp_path):
    rdv = tmp_path / "rdv"
    rdv.mkdir()
    pre = sim.start_simworker(tmp_path, "--role", "prefill",
                              "--bootstrap-port", 9500, "--bootstrap-dir",
                              rdv, "--model", "canon", "--strict-model")
    dec = sim.start_simworker(tmp_path, "--role", "decode",
                              "--bootstrap-dir", rdv, "--model", "canon",
                              "--strict-model")
    try:
        with gw.start_gateway(tmp_path, "--pd-disaggregation",
                              "--prefill", pre.url, 9500,
                              "--decode", dec.url,
                              "--model-alias", "nick=canon") as g:
            g.wait_ready(2)
            for model in ("nick", "canon"):
                r = g.post("/v1/completions", {"model": model,
                                               "prompt": "hello",
                                               "max_tokens": 2})
                assert r.status == 200, (model, r)
            g.stop()
    finally:
        pre.stop()
        dec.stop()
