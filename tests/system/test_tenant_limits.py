"""Tenant limits beyond requests per minute: tokens_per_minute (the
prompt's tokens as the frontend estimates them) and model_rules (one rule
per request, exact before the longest prefix), held in shared memory
across two frontends; a request refused by one limit keeps nothing of
what the others took."""
import json

import gw
import util
from test_datapath_admin import EchoWorker

TENANT = {"x-smg-tenant-id": "team"}


def completion(model, chars):
    # chars / 4 tokens: the frontend's estimate for a text prompt.
    return {"model": model, "prompt": "a" * chars, "max_tokens": 1}


def write_limits(tmp_path, team):
    cfg = tmp_path / "limits.json"
    cfg.write_text(json.dumps({
        "default_policy": {"requests_per_minute": 6000,
                           "tokens_per_minute": 10000000},
        "tenants": [dict(team, tenant_key="header:team")]}))
    return cfg


def start(tmp_path, cfg, workers):
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", *[w.url for w in workers],
                         "--trust-tenant-header",
                         "--tenant-rate-limit-enabled",
                         "--tenant-rate-limit-config", cfg, frontends=2)
    g.wait_ready(len(workers))
    return g


def test_tokens_per_minute(tmp_path):
    ew = EchoWorker("m")
    # 1000 tokens banked, refilled at 1000/60 per second.
    cfg = write_limits(tmp_path, {"requests_per_minute": 6000,
                                  "tokens_per_minute": 1000})
    g = start(tmp_path, cfg, [ew])
    try:
        got = [g.post("/v1/completions", completion("m", 1200),
                      headers=TENANT) for _ in range(4)]
        # 300 tokens each: three fit in the minute's 1000, not four.
        assert [r.status for r in got] == [200, 200, 200, 429], got
        err = got[3].json()["error"]
        assert err["code"] == "tenant_rate_limited"
        assert "tokens_per_minute" in err["message"]
        assert int(got[3].headers["retry-after"]) >= 1
        # A small prompt still fits what is left.
        r = g.post("/v1/completions", completion("m", 200), headers=TENANT)
        assert r.status == 200, r
        # More than a minute's worth never fits: no Retry-After.
        r = g.post("/v1/completions", completion("m", 4400), headers=TENANT)
        assert r.status == 429 and "retry-after" not in r.headers
        # Another tenant has its own bucket.
        r = g.post("/v1/completions", completion("m", 1200),
                   headers={"x-smg-tenant-id": "other"})
        assert r.status == 200
        m = g.metrics()
        assert 'smg_tenant_rate_limit_total{tenant="header:team",' \
               'result="rejected"} 2' in m
    finally:
        g.stop()
        ew.stop()


def test_model_rules(tmp_path):
    workers = [EchoWorker(m) for m in ("m-small", "m-big", "other")]
    cfg = write_limits(tmp_path, {
        # 8 requests banked for the tenant, refilled at one per 7.5 s.
        "requests_per_minute": 8, "tokens_per_minute": 1000000,
        "model_rules": [
            {"rule_id": "small", "matcher": {"type": "exact",
                                             "value": "m-small"},
             "requests_per_minute": 2, "tokens_per_minute": 1000000},
            {"rule_id": "m.any", "matcher": {"type": "prefix",
                                             "value": "m-"},
             "requests_per_minute": 3, "tokens_per_minute": 1000000}]})
    g = start(tmp_path, cfg, workers)
    try:
        def send(model):
            return g.post("/v1/completions", completion(model, 8),
                          headers=TENANT)

        small = [send("m-small") for _ in range(3)]
        assert [r.status for r in small] == [200, 200, 429], small
        assert "model rule 'small'" in small[2].json()["error"]["message"]
        # The exact rule took m-small's requests, not the prefix rule.
        big = [send("m-big") for _ in range(4)]
        assert [r.status for r in big] == [200, 200, 200, 429], big
        assert "model rule 'm.any'" in big[3].json()["error"]["message"]
        # The two refused requests gave back the tenant's request: of the
        # 8, 5 were used, 3 remain for a model no rule names.
        other = [send("other") for _ in range(4)]
        assert [r.status for r in other] == [200, 200, 200, 429], other
        assert "tenant's rate limit" in other[3].json()["error"]["message"]
    finally:
        g.stop()
        for w in workers:
            w.stop()


def test_bad_model_rule_refused(tmp_path):
    """A rule SMG would refuse stops the frontends with the reason: an
    operator who turned limits on must not run unlimited."""
    cfg = write_limits(tmp_path, {
        "requests_per_minute": 60, "tokens_per_minute": 1000,
        "model_rules": [{"rule_id": "bad id", "matcher": {
            "type": "exact", "value": "m"}, "requests_per_minute": 1,
            "tokens_per_minute": 1}]})
    g = gw.Gateway(tmp_path, ["--worker-urls", "http://127.0.0.1:9",
                              "--trust-tenant-header",
                              "--tenant-rate-limit-enabled",
                              "--tenant-rate-limit-config", cfg])
    try:
        util.wait_for(lambda: "rule_id must match" in g.log(), timeout=20,
                      what="the refusal logged")
    finally:
        g.kill()
