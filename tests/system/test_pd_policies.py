"""Leg policies, bucket, per-model policies and the PD startup rules
(policies.md §10.3, §13, §14)."""
import random
import subprocess
import time

import gw
import sim
import util


def _chars(n, rng):
    words = ["alpha", "beta", "gamma", "delta", "omega"]
    out = []
    while sum(len(w) + 1 for w in out) < n:
        out.append(rng.choice(words))
    return " ".join(out)[:n]


def test_bucket_ranges_balance_characters(tmp_path):
    """Bimodal prompt lengths over 2 prefill workers: once the ranges are
    recomputed from the traffic (5 s windows), each worker carries a
    similar share of characters. The balance override is switched off
    (huge --balance-abs-threshold) so the shares come from the ranges."""
    rdv = tmp_path / "rdv"
    rdv.mkdir()
    fast = ["--time-scale", 0]
    pre = [sim.start_simworker(tmp_path, "--role", "prefill",
                               "--bootstrap-port", 9400 + i,
                               "--bootstrap-dir", rdv, *fast,
                               name=f"prefill{i}") for i in range(2)]
    dec = sim.start_simworker(tmp_path, "--role", "decode", "--bootstrap-dir",
                              rdv, *fast, name="decode0")
    try:
        rng = random.Random(7)

        def prompt():
            if rng.random() < 0.5:
                return _chars(rng.randint(40, 400), rng)
            return _chars(rng.randint(1500, 4000), rng)

        args = ["--pd-disaggregation", "--prefill", pre[0].url, 9400,
                "--prefill", pre[1].url, 9401, "--decode", dec.url,
                "--prefill-policy", "bucket", "--decode-policy", "round_robin",
                "--balance-abs-threshold", 1000000000]
        with gw.start_gateway(tmp_path, *args) as g:
            g.wait_ready(3)
            start = time.monotonic()
            # Traffic before the first recomputation (at 5 s).
            while time.monotonic() - start < 2.0:
                r = g.post("/v1/completions", {"model": "sim-model",
                                               "prompt": prompt(),
                                               "max_tokens": 1})
                assert r.status == 200, r
            time.sleep(max(0.0, 6.0 - (time.monotonic() - start)))
            for w in pre:
                w.reset_stats()
            for _ in range(160):
                r = g.post("/v1/completions", {"model": "sim-model",
                                               "prompt": prompt(),
                                               "max_tokens": 1})
                assert r.status == 200, r
            toks = [w.stats()["prompt_tokens"] for w in pre]
            total = sum(toks)
            assert total > 0
            shares = [t / total for t in toks]
            assert min(shares) > 0.3, f"prompt tokens per prefill: {toks}"
            # short requests concentrate on the first worker's range
            assert pre[0].stats()["requests"] > pre[1].stats()["requests"]
    finally:
        for w in pre + [dec]:
            w.stop()


def _selections(metrics, model):
    out = {}
    for line in metrics.splitlines():
        if line.startswith("smg_worker_selection_total{") and \
                f'model="{model}"' in line:
            pol = line.split('policy="')[1].split('"')[0]
            out[pol] = out.get(pol, 0) + float(line.rsplit(" ", 1)[1])
    return out


def test_labelled_model_uses_its_policy(tmp_path):
    wa = [sim.start_simworker(tmp_path, "--model", "m-a", name=f"a{i}")
          for i in range(2)]
    wb = [sim.start_simworker(tmp_path, "--model", "m-b", name=f"b{i}")
          for i in range(2)]
    try:
        args = ["--policy", "round_robin", "--worker-urls", wb[0].url,
                wb[1].url, "--drain-settle-secs", 1]
        with gw.start_gateway(tmp_path, *args) as g:
            for w in wa:
                r = g.post("/workers", {"url": w.url, "models": [{"id": "m-a"}],
                                        "labels": {"policy": "Random"}})
                assert r.status == 202, r
            g.wait_ready(4)
            for i in range(8):
                for m in ("m-a", "m-b"):
                    r = g.post("/v1/completions", {"model": m, "prompt": "hi",
                                                   "max_tokens": 1})
                    assert r.status == 200, r
            sel_a = _selections(g.metrics(), "m-a")
            sel_b = _selections(g.metrics(), "m-b")
            assert sel_a == {"random": 8}, sel_a
            assert sel_b == {"round_robin": 8}, sel_b
            # The mapping goes with the model's last worker; a new first
            # worker decides again.
            for w in wa:
                wid = [x["id"] for x in g.get("/workers").json()["workers"]
                       if x["url"] == w.url][0]
                assert g.request("DELETE", f"/workers/{wid}").status == 202
            util.wait_for(lambda: len(g.get("/workers").json()["workers"]) == 2,
                          what="m-a workers removed")
            r = g.post("/workers", {"url": wa[0].url, "models": [{"id": "m-a"}],
                                    "labels": {"policy": "prefix_hash"}})
            assert r.status == 202, r
            g.wait_ready(3)
            r = g.post("/v1/completions", {"model": "m-a", "prompt": "hi",
                                           "max_tokens": 1})
            assert r.status == 200, r
            assert _selections(g.metrics(), "m-a").get("prefix_hash") == 1
    finally:
        for w in wa + wb:
            w.stop()


STARTUP_REJECTS = [
    (["--pd-disaggregation", "--decode-policy", "bucket"],
     "--decode-policy"),
    (["--pd-disaggregation", "--prefill-policy", "passthrough"],
     "--prefill-policy"),
    (["--pd-disaggregation", "--decode-policy", "passthrough"],
     "--decode-policy"),
    (["--pd-disaggregation", "--prefill-policy", "power_of_two",
      "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2",
      "--decode", "http://127.0.0.1:3"], "--prefill-policy"),
    (["--pd-disaggregation", "--decode-policy", "power_of_two",
      "--prefill", "http://127.0.0.1:1", "--prefill", "http://127.0.0.1:2",
      "--decode", "http://127.0.0.1:3"], "--decode-policy"),
    (["--epd-disaggregation", "--encode-policy", "cache_aware"],
     "--encode-policy"),
    (["--epd-disaggregation", "--encode-policy", "power_of_two"],
     "--encode-policy"),
    (["--epd-disaggregation", "--policy", "bucket"], "--policy"),
]


def test_pd_startup_rules(tmp_path):
    for args, flag in STARTUP_REJECTS:
        p = subprocess.run([util.binary("smg"), *args,
                            "--run-dir", str(tmp_path / "run"),
                            "--state-dir", str(tmp_path / "state")],
                           capture_output=True, text=True, timeout=10)
        assert p.returncode == 2, (args, p.returncode, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, (args, p.stderr)
        assert lines[0].startswith(f"smg: {flag}"), (args, p.stderr)
