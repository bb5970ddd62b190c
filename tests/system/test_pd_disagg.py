"""PD and EPD disaggregation end to end (gateway.md §3.2, §11).

Simulated prefill, decode and encode workers meet by bootstrap room in a
shared directory: a decode request runs only once the prefill worker named
by its bootstrap_host/bootstrap_port finished the same room, so a wrong
bootstrap field or a dropped leg shows up as a failed request.
"""
import http.client
import json
import threading
import time

import gw
import sim
import util


def _pd_sims(tmp_path, n_prefill=1, n_decode=1, timeout=2.0, extra=()):
    rdv = tmp_path / "rdv"
    rdv.mkdir(exist_ok=True)
    prefill, decode = [], []
    for i in range(n_prefill):
        prefill.append(sim.start_simworker(
            tmp_path, "--role", "prefill", "--bootstrap-port", 9100 + i,
            "--bootstrap-dir", rdv, "--worker-id", f"P{i}", *extra,
            name=f"prefill{i}"))
    for i in range(n_decode):
        decode.append(sim.start_simworker(
            tmp_path, "--role", "decode", "--bootstrap-dir", rdv,
            "--bootstrap-timeout", timeout, "--worker-id", f"D{i}", *extra,
            name=f"decode{i}"))
    return prefill, decode


def _pd_args(prefill, decode, *more):
    args = ["--pd-disaggregation"]
    for i, p in enumerate(prefill):
        args += ["--prefill", p.url, 9100 + i]
    for d in decode:
        args += ["--decode", d.url]
    return args + list(more)


def _stop(*workers):
    for w in workers:
        w.stop()


def _stream(port, path, body, timeout=10.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_pd_request_reaches_both_legs(tmp_path):
    prefill, decode = _pd_sims(tmp_path)
    try:
        with gw.start_gateway(tmp_path, *_pd_args(prefill, decode,
                                                  "--policy", "round_robin")) as g:
            g.wait_ready(2)
            r = g.get("/readiness")
            assert r.status == 200, r
            # Non-streaming: the decode worker's body and headers.
            r = g.post("/generate", {"text": "hello world",
                                     "sampling_params": {"max_new_tokens": 4}})
            assert r.status == 200, r
            assert r.headers["x-sim-worker"] == "D0"
            assert r.headers["x-smg-routed-worker-id"] == decode[0].url
            assert r.json()["meta_info"]["completion_tokens"] == 4
            ps, ds = prefill[0].stats()["bootstrap"], decode[0].stats()["bootstrap"]
            assert ps["rooms"] == ds["rooms"] and len(ps["rooms"]) == 1
            assert 0 <= int(ps["rooms"][0]) < 2 ** 63
            assert ds["last_host"] == "127.0.0.1" and ds["last_port"] == "9100"
            assert ps["published"] == 1 and ds["received"] == 1
            # Streaming: the decode worker's SSE, [DONE] preserved.
            status, headers, body = _stream(
                g.port, "/v1/completions",
                {"prompt": "one two three", "stream": True, "max_tokens": 3})
            assert status == 200
            assert headers["content-type"] == "text/event-stream"
            assert headers["x-sim-worker"] == "D0"
            events = [e for e in body.decode().split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            assert sum(1 for e in events if '"text_completion"' in e) >= 3
            ps, ds = prefill[0].stats()["bootstrap"], decode[0].stats()["bootstrap"]
            assert ps["rooms"] == ds["rooms"] and len(set(ps["rooms"])) == 2
            r = g.get("/health_generate")
            assert r.status == 200, r
            m = g.metrics()
            assert 'smg_worker_selection_total{worker_type="prefill"' in m
            assert 'smg_worker_selection_total{worker_type="decode"' in m
            assert "smg_pd_ttft_seconds_count" in m
            assert "smg_pd_prefill_duration_seconds_count" in m
    finally:
        _stop(*prefill, *decode)


def test_pd_prefill_failure_cancels_decode(tmp_path):
    prefill, decode = _pd_sims(tmp_path, timeout=1.0)
    try:
        with gw.start_gateway(tmp_path, *_pd_args(
                prefill, decode, "--policy", "round_robin",
                "--retry-max-retries", 3, "--cb-failure-threshold", 100)) as g:
            g.wait_ready(2)
            prefill[0].control(fail_rate=1.0, status=500)
            start = time.monotonic()
            r = g.post("/generate", {"text": "hello",
                                     "sampling_params": {"max_new_tokens": 8}})
            took = time.monotonic() - start
            assert r.status == 500, r
            assert r.headers["x-smg-error-code"] == "prefill_internal_error"
            assert r.json()["error"]["message"] == "injected failure"
            assert took < 1.0, f"the failure took {took:.2f}s"
            # No decode request is left waiting for its room: every one that
            # arrived was cancelled, none ran into the bootstrap timeout.
            time.sleep(1.5)
            ds = decode[0].stats()
            assert ds["bootstrap"]["waiting"] == 0
            assert ds["bootstrap"]["timeouts"] == 0
            assert ds["bootstrap"]["received"] == 0
            assert ds["bootstrap"]["aborted"] == ds["routes"]["/generate"]
            assert "smg_pd_bootstrap_failures_total 3" in g.metrics()

            # Bad request on the prefill leg: mapped, not retried.
            prefill[0].control(fail_rate=1.0, status=400)
            r = g.post("/generate", {"text": "x"})
            assert r.status == 400
            assert r.headers["x-smg-error-code"] == "prefill_bad_request"

            # The prefill worker dies with a request in flight: 502 at once
            # and the decode request is cancelled, not left to time out.
            prefill[0].control(fail_rate=0.0, hang_rate=1.0)
            decode[0].reset_stats()
            before = decode[0].stats()["bootstrap"]["aborted"]
            box = {}

            def send():
                box["r"] = g.post("/generate", {"text": "hang"}, timeout=20)

            t = threading.Thread(target=send)
            t.start()
            util.wait_for(lambda: decode[0].stats()["bootstrap"]["waiting"] == 1,
                          what="decode waiting for its room")
            prefill[0].proc.kill()
            t.join(10)
            assert box["r"].status == 502, box["r"]
            assert box["r"].headers["x-smg-error-code"] == "pd_request_failed"
            # (each retry's decode request is cancelled the same way)
            util.wait_for(
                lambda: decode[0].stats()["bootstrap"]["aborted"] > before,
                what="decode request cancelled")
            util.wait_for(lambda: decode[0].stats()["bootstrap"]["waiting"] == 0,
                          what="no decode request left waiting")
            assert decode[0].stats()["bootstrap"]["timeouts"] == 0
    finally:
        decode[0].stop()


def test_pd_decode_failure(tmp_path):
    prefill, decode = _pd_sims(tmp_path)
    try:
        with gw.start_gateway(tmp_path, *_pd_args(
                prefill, decode, "--policy", "random",
                "--disable-retries")) as g:
            g.wait_ready(2)
            decode[0].control(fail_rate=1.0, status=503)
            r = g.post("/generate", {"text": "hello"})
            assert r.status == 503, r
            assert r.headers["x-smg-error-code"] == "decode_unavailable"
            status, headers, body = _stream(
                g.port, "/generate", {"text": "hello", "stream": True})
            assert status == 503
            ev = json.loads(body.decode().strip()[len("data: "):])
            assert ev["error"]["status"] == 503
            assert ev["error"]["message"]["message"] == "injected failure"
    finally:
        _stop(*prefill, *decode)


def test_pd_readiness_and_health_generate(tmp_path):
    prefill, _ = _pd_sims(tmp_path, n_decode=0)
    dead = f"http://127.0.0.1:{util.free_port()}"
    try:
        with gw.start_gateway(tmp_path, "--pd-disaggregation", "--prefill",
                              prefill[0].url, "--decode", dead,
                              "--policy", "random") as g:
            g.wait_ready(1)
            r = g.get("/readiness")
            assert r.status == 503, r
            assert r.json() == {"status": "not ready",
                                "reason": "insufficient healthy workers"}
            r = g.get("/health_generate")
            assert r.status == 503, r
            assert r.headers["x-smg-error-code"] == "no_healthy_worker_pair"
            r = g.post("/generate", {"text": "x"})
            assert r.status == 503, r
            assert r.headers["x-smg-error-code"] == "server_selection_failed"
    finally:
        _stop(*prefill)


def test_epd_encode_leg(tmp_path):
    rdv = tmp_path / "rdv"
    rdv.mkdir()
    enc = sim.start_simworker(tmp_path, "--role", "encode",
                              "--bootstrap-port", 9300, "--bootstrap-dir",
                              rdv, "--worker-id", "E0", name="encode0")
    pre = sim.start_simworker(tmp_path, "--role", "prefill",
                              "--bootstrap-port", 9301, "--bootstrap-dir",
                              rdv, "--bootstrap-timeout", 2,
                              "--worker-id", "P0", name="prefill0")
    dec = sim.start_simworker(tmp_path, "--role", "decode",
                              "--bootstrap-dir", rdv, "--bootstrap-timeout",
                              2, "--worker-id", "D0", name="decode0")
    try:
        with gw.start_gateway(tmp_path, "--epd-disaggregation",
                              "--encode", enc.url, 9300,
                              "--prefill", pre.url, 9301, "--decode", dec.url,
                              "--policy", "round_robin",
                              "--encode-policy", "random") as g:
            g.wait_ready(3)
            assert g.get("/readiness").status == 200
            r = g.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "describe it"}],
                "max_tokens": 2})
            assert r.status == 200, r
            assert r.headers["x-sim-worker"] == "D0"
            es = enc.stats()["bootstrap"]
            ps = pre.stats()["bootstrap"]
            ds = dec.stats()["bootstrap"]
            # encode -> prefill -> decode, all on the same room
            assert es["published"] == 1 and ps["received"] == 1
            assert ps["published"] == 1 and ds["received"] == 1
            assert es["rooms"] == ps["rooms"] == ds["rooms"]
            assert 'smg_worker_selection_total{worker_type="encode"' in \
                g.metrics()
    finally:
        _stop(enc, pre, dec)
