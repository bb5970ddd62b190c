"""SMG's routes of gateway.md §3 that fan out or pass through, as SMG
answers them (model_gateway/src/worker/manager.rs, server.rs,
routers/router_manager.rs): /engine_metrics merges the workers' /metrics
with a worker_addr label; /start_profile and /stop_profile POST to every
worker (or the one named by "url") with SMG's ProfileResult;
/v1/audio/transcriptions relays the multipart upload as it is; with
--enable-igw, /generate without a model is 400 missing_model.
"""
import http.client
import os

import gw
import sim
import util


def test_engine_metrics_merges_workers_with_worker_addr(tmp_path):
    a = sim.start_simworker(tmp_path, "--time-scale", "0")
    b = sim.start_simworker(tmp_path, "--time-scale", "0", "--engine",
                            "vllm")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", a.url, b.url) as g:
            g.wait_ready(2)
            r = g.get("/engine_metrics")
            assert r.status == 200, r
            assert r.headers["content-type"].startswith("text/plain")
            text = r.body.decode()
            samples = [ln for ln in text.splitlines()
                       if ln and not ln.startswith("#")]
            assert samples
            for ln in samples:
                assert ln.split("{", 1)[1].startswith("worker_addr="), ln
            for w in (a, b):
                assert f'worker_addr="{w.url}"' in text
            # One HELP and TYPE per family, names without ':'.
            helps = [ln.split()[2] for ln in text.splitlines()
                     if ln.startswith("# HELP ")]
            assert len(helps) == len(set(helps))
            assert all(":" not in h for h in helps)
            g.stop()
    finally:
        a.stop()
        b.stop()


def test_engine_metrics_without_workers_is_500(tmp_path):
    with gw.start_gateway(tmp_path, "--policy", "round_robin") as g:
        r = g.get("/engine_metrics")
        assert r.status == 500, r
        assert r.body == b"No available workers"
        assert g.request("POST", "/engine_metrics").status == 405
        g.stop()


def test_profile_fan_out(tmp_path):
    a = sim.start_simworker(tmp_path, "--time-scale", "0")
    b = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", a.url, b.url) as g:
            g.wait_ready(2)
            r = g.post("/start_profile", {"num_steps": 3,
                                          "activities": ["CPU"]})
            assert r.status == 200, r
            assert r.json() == {
                "status": "success",
                "message": "Successfully started profiling on all 2 workers",
                "workers_profiled": 2, "total_workers": 2}
            r = g.post("/stop_profile")
            assert r.status == 200, r
            assert r.json()["message"] == \
                "Successfully stopped profiling on all 2 workers"
            # One worker by url.
            r = g.post("/start_profile", {"url": b.url})
            assert r.status == 200 and r.json()["total_workers"] == 1, r
            r = g.post("/stop_profile", {"url": "http://127.0.0.1:1"})
            assert r.status == 404 and r.json()["status"] == "error", r
            # One worker down: 206 partial_success naming it.
            b.stop()
            r = g.post("/start_profile", {})
            assert r.status == 206, r
            body = r.json()
            assert body["status"] == "partial_success"
            assert body["successful"] == [a.url]
            assert [f["worker"] for f in body["failed"]] == [b.url]
            assert g.request("GET", "/start_profile").status == 405
            r = g.post("/start_profile", "[1]")
            assert r.status == 400, r
            g.stop()
    finally:
        a.stop()
        if b.proc.alive():
            b.stop()


def _multipart(boundary, audio):
    parts = [
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\""
        f"\r\n\r\nwhisper-1\r\n".encode(),
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
        f"filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n".encode(),
        audio, f"\r\n--{boundary}--\r\n".encode()]
    return b"".join(parts)


def test_audio_transcriptions_streamed_through(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            boundary = "smgboundary7"
            body = _multipart(boundary, os.urandom(200_000))
            ctype = f"multipart/form-data; boundary={boundary}"
            r = g.post("/v1/audio/transcriptions", body,
                       headers={"Content-Type": ctype}, timeout=20)
            assert r.status == 200, r
            assert r.json() == {"text": "simulated transcription",
                                "bytes": len(body), "has_model": True}
            assert r.headers["x-smg-routed-worker-id"] == w.url
            # Chunked upload (no length): buffered, relayed the same.
            conn = http.client.HTTPConnection("127.0.0.1", g.port,
                                              timeout=20)
            try:
                conn.request("POST", "/v1/audio/transcriptions",
                             body=iter([body[:1000], body[1000:]]),
                             headers={"Content-Type": ctype},
                             encode_chunked=True)
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            assert resp.status == 200, data
            assert b'"bytes":%d' % len(body) in data
            m = g.metrics()
            assert "smg_router_streamed_request_bodies_total" in m
            g.stop()
    finally:
        w.stop()


def test_igw_generate_without_model_is_missing_model(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--enable-igw", "--policy",
                              "round_robin", "--worker-urls", w.url) as g:
            g.wait_ready(1)
            for body in ({"text": "hi"}, {"text": "hi", "model": ""},
                         {"text": "hi", "model": "unknown"}):
                r = g.post("/generate", body)
                assert r.status == 400, (body, r)
                err = r.json()["error"]
                assert err["code"] == "missing_model", err
                assert err["message"] == ("/generate requests must include "
                                          "a model when IGW routing is "
                                          "enabled")
            r = g.post("/generate", {"text": "hi", "model": "sim-model"})
            assert r.status == 200, r
            g.stop()
    finally:
        w.stop()
