"""PD follow-ups end to end (gateway.md §3.2, §11): return_logprob merging
of the prefill's input_token_logprobs into the decode response, the
metadata routes in PD mode (/get_model_info, /get_server_info answered by
a prefill worker, else a decode worker; /v1/models), and the DP-rank fields
of workers registered as "<url>@<rank>".

The simulated prefill worker reports every prompt token's logprob; the
decode worker only the last one (the prompt's KV cache came from the
prefill), so a merged list is the prefill's followed by the decode's.
"""
import http.client
import json

import gw
import sim
import util

TEXT = "the quick brown fox jumps over the lazy dog"


def _pd(tmp_path, prefill=True, decode=True):
    rdv = tmp_path / "rdv"
    rdv.mkdir(exist_ok=True)
    p = d = None
    if prefill:
        p = sim.start_simworker(tmp_path, "--role", "prefill",
                                "--bootstrap-port", 9100, "--bootstrap-dir",
                                rdv, "--worker-id", "P0", name="prefill0")
    if decode:
        d = sim.start_simworker(tmp_path, "--role", "decode",
                                "--bootstrap-dir", rdv, "--bootstrap-timeout",
                                2, "--worker-id", "D0", name="decode0")
    return p, d


def _events(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port,
                                      timeout=10 * util.TIMEOUT_MULT)
    try:
        conn.request("POST", "/generate", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        headers = {k.lower(): v for k, v in r.getheaders()}
        return headers, [e for e in r.read().decode().split("\n\n") if e]
    finally:
        conn.close()


def test_pd_return_logprob_merge(tmp_path):
    p, d = _pd(tmp_path)
    # The prefill worker's own list, asked directly (no bootstrap room).
    try:
        r = util.post(p.port, "/generate", {"text": TEXT, "return_logprob": True})
        assert r.status == 200, r
        plp = r.json()["meta_info"]["input_token_logprobs"]
        ntok = r.json()["meta_info"]["prompt_tokens"]
        assert len(plp) == ntok > 2 and plp[0][0] is None
        want = plp + [plp[-1]]
        with gw.start_gateway(tmp_path, "--pd-disaggregation", "--prefill",
                              p.url, 9100, "--decode", d.url,
                              "--policy", "round_robin") as g:
            g.wait_ready(2)
            # Non-streaming: prefill list first, then the decode's.
            r = g.post("/generate", {"text": TEXT, "return_logprob": True,
                                     "sampling_params": {"max_new_tokens": 3}})
            assert r.status == 200, r
            assert r.headers["x-sim-worker"] == "D0"
            assert int(r.headers["content-length"]) == len(r.body)
            body = r.json()
            assert body["meta_info"]["input_token_logprobs"] == want
            assert body["meta_info"]["completion_tokens"] == 3
            # Not asked: the decode response as it is.
            r = g.post("/generate", {"text": TEXT})
            assert r.status == 200, r
            assert "input_token_logprobs" not in r.json()["meta_info"]
            # Streaming: every event that carries the list gets it merged.
            headers, events = _events(g.port, {
                "text": TEXT, "stream": True, "return_logprob": True,
                "sampling_params": {"max_new_tokens": 4}})
            assert headers["x-sim-worker"] == "D0"
            assert events[-1] == "data: [DONE]"
            data = [json.loads(e[len("data: "):]) for e in events[:-1]]
            assert len(data) == 4
            for ev in data:
                assert ev["meta_info"]["input_token_logprobs"] == want
            # The prefill and decode legs met: merging did not break PD.
            assert p.stats()["bootstrap"]["rooms"] == \
                d.stats()["bootstrap"]["rooms"]
    finally:
        p.stop()
        d.stop()


def test_pd_metadata_routes(tmp_path):
    p, d = _pd(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--pd-disaggregation", "--prefill",
                              p.url, 9100, "--decode", d.url,
                              "--policy", "random") as g:
            g.wait_ready(2)
            for path in ("/get_model_info", "/get_server_info"):
                r = g.get(path)
                assert r.status == 200, r
                assert r.headers["x-sim-worker"] == "P0", path
            assert g.get("/get_model_info").json()["model_path"] == "sim-model"
            r = g.get("/v1/models")
            assert r.status == 200, r
            assert [m["id"] for m in r.json()["data"]] == ["sim-model"]
        p.stop()
        # No prefill worker Ready: the decode worker answers.
        dead = f"http://127.0.0.1:{util.free_port()}"
        with gw.start_gateway(tmp_path, "--pd-disaggregation", "--prefill",
                              dead, "--decode", d.url,
                              "--policy", "random") as g:
            g.wait_ready(1)
            r = g.get("/get_server_info")
            assert r.status == 200, r
            assert r.headers["x-sim-worker"] == "D0"
        d.stop()
        with gw.start_gateway(tmp_path, "--pd-disaggregation", "--prefill",
                              dead, "--decode", dead, "--policy",
                              "random") as g:
            g.wait_live()
            r = g.get("/get_model_info")
            assert r.status == 503, r
            assert r.headers["x-smg-error-code"] == "no_workers"
    finally:
        p.stop()
        d.stop()


def test_pd_dp_rank_fields(tmp_path):
    p, d = _pd(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--pd-disaggregation", "--prefill",
                              p.url, 9100, "--policy", "round_robin") as g:
            g.wait_ready(1)
            r = g.post("/workers", {"url": d.url + "@1",
                                    "worker_type": "decode"})
            assert r.status == 202, r
            g.wait_ready(2)
            r = g.post("/generate", {"text": TEXT})
            assert r.status == 200, r
            assert r.headers["x-smg-routed-worker-id"] == d.url + "@1"
            ds = d.stats()["bootstrap"]
            assert ds["last_dp_rank"] == 1
            assert ds["last_prefill_dp_rank"] is None
            assert p.stats()["bootstrap"]["last_dp_rank"] is None
    finally:
        p.stop()
        d.stop()


def test_pd_dp_aware_both_legs(tmp_path):
    """--dp-aware in PD mode: the prefill and decode engines each report
    two ranks, become "<url>@0" and "<url>@1" workers, and both legs carry
    their ranks (routed_dp_rank; the decode leg also the prefill's)."""
    rdv = tmp_path / "rdv"
    rdv.mkdir(exist_ok=True)
    p = sim.start_simworker(tmp_path, "--role", "prefill", "--dp-size", 2,
                            "--bootstrap-port", 9100, "--bootstrap-dir", rdv,
                            "--worker-id", "P0", name="prefill0")
    d = sim.start_simworker(tmp_path, "--role", "decode", "--dp-size", 2,
                            "--bootstrap-dir", rdv, "--bootstrap-timeout", 2,
                            "--worker-id", "D0", name="decode0")
    try:
        with gw.start_gateway(tmp_path, "--pd-disaggregation", "--dp-aware",
                              "--prefill", p.url, 9100, "--decode", d.url,
                              "--policy", "round_robin") as g:
            g.wait_ready(4)
            urls = sorted(w["url"] for w in g.get("/workers").json()
                          ["workers"])
            assert urls == sorted([p.url + "@0", p.url + "@1",
                                   d.url + "@0", d.url + "@1"]), urls
            seen = set()
            for _ in range(4):
                r = g.post("/generate", {"text": TEXT})
                assert r.status == 200, r
                routed = r.headers["x-smg-routed-worker-id"]
                assert routed.startswith(d.url + "@"), routed
                ds = d.stats()["bootstrap"]
                assert ds["last_dp_rank"] == int(routed.rsplit("@")[1])
                pr = p.stats()["bootstrap"]["last_dp_rank"]
                assert pr in (0, 1)
                assert ds["last_prefill_dp_rank"] == pr
                seen.add((pr, ds["last_dp_rank"]))
            # round_robin on each leg: both ranks of each engine serve.
            assert {a for a, _ in seen} == {0, 1}, seen
            assert {b for _, b in seen} == {0, 1}, seen
    finally:
        p.stop()
        d.stop()
