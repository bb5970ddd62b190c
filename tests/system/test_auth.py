"""Who may do what: control-plane keys and roles, JWTs verified against a
local JWKS server (keys made at test time with the openssl CLI), the audit
log, tenant keys and per-tenant rates across two frontends, CORS, and the
W3C trace context sent to workers."""
import base64
import concurrent.futures
import http.server
import json
import os
import re
import subprocess
import threading
import time

import gw
import sim
import util
from test_datapath_admin import EchoWorker


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def der_ecdsa_to_raw(der, size):
    """An ECDSA DER signature (SEQUENCE of two INTEGERs) as r || s."""
    assert der[0] == 0x30
    i = 2 if der[1] < 0x80 else 3
    out = b""
    for _ in range(2):
        assert der[i] == 0x02
        n = der[i + 1]
        v = der[i + 2:i + 2 + n].lstrip(b"\0")
        out += v.rjust(size, b"\0")
        i += 2 + n
    return out


class Key:
    """An RSA (RS256) or P-256 (ES256) key made with openssl."""

    def __init__(self, tmp_path, kid, kind="RSA"):
        self.kid, self.kind = kid, kind
        self.pem = str(tmp_path / f"{kid}.pem")
        if kind == "RSA":
            subprocess.run(["openssl", "genpkey", "-algorithm", "RSA",
                            "-pkeyopt", "rsa_keygen_bits:2048",
                            "-out", self.pem], check=True,
                           capture_output=True)
            mod = subprocess.run(["openssl", "rsa", "-in", self.pem,
                                  "-noout", "-modulus"], check=True,
                                 capture_output=True, text=True).stdout
            n = bytes.fromhex(mod.strip().split("=", 1)[1])
            self.jwk = {"kty": "RSA", "kid": kid, "use": "sig",
                        "alg": "RS256", "n": b64u(n), "e": b64u(b"\1\0\1")}
        else:
            subprocess.run(["openssl", "ecparam", "-name", "prime256v1",
                            "-genkey", "-noout", "-out", self.pem],
                           check=True, capture_output=True)
            der = subprocess.run(["openssl", "ec", "-in", self.pem,
                                  "-pubout", "-outform", "DER"], check=True,
                                 capture_output=True).stdout
            pt = der[-65:]
            assert pt[0] == 4
            self.jwk = {"kty": "EC", "kid": kid, "crv": "P-256",
                        "x": b64u(pt[1:33]), "y": b64u(pt[33:])}

    def sign(self, claims, header=None):
        alg = "RS256" if self.kind == "RSA" else "ES256"
        head = header or {"alg": alg, "typ": "JWT", "kid": self.kid}
        msg = (b64u(json.dumps(head).encode()) + "." +
               b64u(json.dumps(claims).encode()))
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign",
                              self.pem], input=msg.encode(), check=True,
                             capture_output=True).stdout
        if self.kind != "RSA":
            sig = der_ecdsa_to_raw(sig, 32)
        return msg + "." + b64u(sig)


class Idp:
    """An OIDC issuer on loopback: discovery document and JWKS."""

    def __init__(self):
        self.keys = []
        self.fetches = 0
        idp = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": idp.issuer,
                            "jwks_uri": idp.issuer + "/keys"}
                elif self.path == "/keys":
                    idp.fetches += 1
                    body = {"keys": [k.jwk for k in idp.keys]}
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      Handler)
        self.server.daemon_threads = True
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def chat():
    return {"model": "sim-model", "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}]}


def bearer(tok):
    return {"Authorization": f"Bearer {tok}"}


def claims(idp, **kw):
    now = int(time.time())
    c = {"iss": idp.issuer, "aud": "smg", "sub": "alice", "iat": now,
         "exp": now + 600}
    c.update(kw)
    return c


def audit_lines(g):
    out = []
    for ln in g.log().splitlines():
        i = ln.find("control_plane_audit ")
        if i >= 0:
            out.append(json.loads(ln[i + len("control_plane_audit "):]))
    return out


def test_jwt_roles_rotation_and_audit(tmp_path):
    idp = Idp()
    k1 = Key(tmp_path, "k1")
    ke = Key(tmp_path, "e1", kind="EC")
    idp.keys = [k1, ke]
    w = sim.start_simworker(tmp_path, "--model", "sim-model")
    w2 = sim.start_simworker(tmp_path, "--model", "sim-model")
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url, "--api-key", "dp-key",
                         "--jwt-issuer", idp.issuer, "--jwt-audience", "smg",
                         "--jwt-role-mapping", "gw-admins=admin")
    try:
        g.wait_ready(1)
        util.wait_for(lambda: os.path.exists(g.run_dir + "/jwks.json"),
                      what="the key set shared by the poller")
        user = k1.sign(claims(idp, roles=["reader"]))
        admin = k1.sign(claims(idp, sub="bob", groups=["gw-admins"]))
        # Frontends load the file when it appears.
        util.wait_for(lambda: g.get("/workers", headers=bearer(admin))
                      .status == 200, what="admin token accepted")

        r = g.post("/v1/chat/completions", chat(), headers=bearer(user))
        assert r.status == 200, r
        assert g.post("/v1/chat/completions", chat()).status == 401
        r = g.post("/workers", {"url": w2.url}, headers=bearer(user))
        assert r.status == 403, r
        r = g.post("/workers", {"url": w2.url}, headers=bearer(admin))
        assert r.status == 202, r
        wid = r.json()["worker_id"]
        r = g.request("DELETE", f"/workers/{wid}", headers=bearer(admin))
        assert r.status in (200, 202), r
        # With a role mapping, only mapped names grant a role.
        r = g.get("/workers", headers=bearer(ke.sign(
            claims(idp, role="admin"))))
        assert r.status == 403, r
        r = g.get("/workers", headers=bearer(ke.sign(
            claims(idp, group="gw-admins"))))
        assert r.status == 200, r

        now = int(time.time())
        bad = {
            "expired": k1.sign(claims(idp, exp=now - 120, roles="admin")),
            "not yet valid": k1.sign(claims(idp, nbf=now + 600,
                                            roles="admin")),
            "wrong audience": k1.sign(claims(idp, aud="other",
                                             roles="admin")),
            "wrong issuer": k1.sign(claims(idp, iss="http://127.0.0.1:1",
                                           roles="admin")),
            "wrong signature": admin[:-8] + ("A" * 8 if admin[-8:] !=
                                             "A" * 8 else "B" * 8),
            "alg none": (b64u(b'{"alg":"none","kid":"k1"}') + "." +
                         b64u(json.dumps(claims(idp, roles="admin"))
                              .encode()) + "."),
            "hmac confusion": k1.sign(claims(idp, roles="admin"),
                                      header={"alg": "HS256",
                                              "kid": "k1"}),
        }
        for what, tok in bad.items():
            r = g.get("/workers", headers=bearer(tok))
            assert r.status == 401, (what, r)
            assert r.headers["www-authenticate"].startswith("Bearer")
            r = g.post("/v1/chat/completions", chat(), headers=bearer(tok))
            assert r.status == 401, (what, r)

        # The issuer rotates: k2 replaces k1. A k2 token is refused until
        # the key set is fetched again, which the unknown kid asks for.
        k2 = Key(tmp_path, "k2")
        fetches = idp.fetches
        idp.keys = [k2, ke]
        admin2 = k2.sign(claims(idp, sub="carol", roles=["gw-admins"]))
        t0 = time.monotonic()
        util.wait_for(lambda: g.get("/workers", headers=bearer(admin2))
                      .status == 200, timeout=20,
                      what="the rotated key followed")
        took = time.monotonic() - t0
        assert idp.fetches == fetches + 1  # one refresh
        print(f"rotation followed in {took:.2f} s")
        # k1 is gone from the set: its tokens, even cached ones, are not.
        assert g.get("/workers", headers=bearer(admin)).status == 401

        # The issuer down: the key set in hand still verifies.
        idp.stop()
        assert g.get("/workers", headers=bearer(admin2)).status == 200

        lines = audit_lines(g)
        added = [a for a in lines if a["method"] == "POST" and
                 a["path"] == "/workers" and a["outcome"] == "success"]
        assert added and added[0]["principal"] == "bob"
        assert added[0]["auth_method"] == "jwt"
        assert added[0]["role"] == "admin" and added[0]["request_id"]
        removed = [a for a in lines if a["method"] == "DELETE"]
        assert removed and removed[0]["resource"] == wid
        assert removed[0]["outcome"] == "success"
        denied = [a for a in lines if a["outcome"] == "denied"]
        assert any(a["principal"] == "alice" and a["role"] == "user" and
                   a["path"] == "/workers" for a in denied)
        assert any("expired" in a.get("details", "") for a in denied)
    finally:
        g.stop()
        w.stop()
        w2.stop()
        idp.stop()


def test_control_plane_keys_and_tenant_keys(tmp_path):
    w = sim.start_simworker(tmp_path, "--model", "sim-model")
    env = dict(os.environ)
    env["CONTROL_PLANE_API_KEYS"] = ("ops1:Ops:admin:s3cret:with:colons,"
                                     "dev1:Dev:user:d3v")
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url, "--api-key", "shared",
                         "--tenant-api-key", "acme:acme-key", env=env)
    try:
        g.wait_ready(1)
        adm = bearer("s3cret:with:colons")
        assert g.get("/workers", headers=adm).status == 200
        assert g.get("/get_loads", headers=adm).status == 200
        assert g.get("/workers", headers=bearer("d3v")).status == 403
        assert g.get("/workers", headers=bearer("shared")).status == 401
        assert g.get("/workers").status == 401
        # Data plane: the shared key, a tenant key, any control-plane key.
        for tok in ("shared", "acme-key", "d3v"):
            r = g.post("/v1/chat/completions", chat(), headers=bearer(tok))
            assert r.status == 200, (tok, r)
        assert g.get("/v1/models", headers=bearer("acme-key")).status == 200
        assert g.get("/v1/models", headers=bearer("nope")).status == 401
        assert g.post("/v1/chat/completions", chat(),
                      headers=bearer("nope")).status == 401
        lines = audit_lines(g)
        assert any(a["principal"] == "ops1" and a["auth_method"] == "api_key"
                   and a["outcome"] == "success" for a in lines)
        assert any(a["principal"] == "unauthenticated" and
                   a["outcome"] == "denied" for a in lines)
        assert "s3cret" not in g.log() and "d3v" not in g.log()
    finally:
        g.stop()
        w.stop()


def test_audit_off_and_escaped(tmp_path):
    w = sim.start_simworker(tmp_path, "--model", "sim-model")
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url,
                         "--control-plane-api-keys", "a:A:admin:k",
                         "--disable-audit-logging")
    try:
        g.wait_ready(1)
        assert g.get("/workers", headers=bearer("k")).status == 200
        assert g.get("/workers/x%0Ay", headers=bearer("k")).status == 400
        assert audit_lines(g) == []
    finally:
        g.stop()
        w.stop()


def send_at_rate(g, key, rate, secs):
    """rate requests/s for secs (one connection each, so both frontends
    get them); returns the statuses."""
    n = int(rate * secs)
    t0 = time.monotonic() + 0.2
    statuses = []

    def one(i):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return g.post("/v1/chat/completions", chat(), headers=bearer(key),
                      timeout=30).status

    with concurrent.futures.ThreadPoolExecutor(48) as ex:
        statuses = list(ex.map(one, range(n)))
    return statuses, time.monotonic() - t0


def test_tenant_rate_limits_across_frontends(tmp_path):
    cfg = tmp_path / "limits.json"
    cfg.write_text(json.dumps({
        "default_policy": {"requests_per_minute": 60,
                           "tokens_per_minute": 100000},
        "tenants": [
            {"tenant_key": "auth:small", "requests_per_minute": 300,
             "tokens_per_minute": 100000, "burst": 1},
            # A small bucket absorbs the senders' jitter (0.1 s of rate).
            {"tenant_key": "auth:big", "requests_per_minute": 3000,
             "tokens_per_minute": 100000, "burst": 5},
        ]}))
    w = sim.start_simworker(tmp_path, "--model", "sim-model",
                            "--max-running", 256)
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url,
                         "--tenant-api-key", "small:ks",
                         "--tenant-api-key", "big:kb",
                         "--tenant-rate-limit-enabled",
                         "--tenant-rate-limit-config", cfg, frontends=2)
    try:
        g.wait_ready(1)
        res = {}

        def run(name, key):
            res[name] = send_at_rate(g, key, 100, 5)

        ts = [threading.Thread(target=run, args=a)
              for a in (("small", "ks"), ("big", "kb"))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        for name, limit in (("small", 5), ("big", 50)):
            statuses, secs = res[name]
            ok = statuses.count(200)
            refused = statuses.count(429)
            print(f"{name}: {ok} served, {refused} refused in {secs:.2f} s "
                  f"(limit {limit}/s)")
            assert ok + refused == len(statuses), statuses
            assert abs(ok / secs - limit) <= 0.15 * limit, (name, ok, secs)
        m = g.metrics()
        assert 'smg_tenant_rate_limit_total{tenant="auth:small",' \
               'result="rejected"}' in m
    finally:
        g.stop()
        w.stop()


def test_cors(tmp_path):
    w = sim.start_simworker(tmp_path, "--model", "sim-model")
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url, "--api-key", "k",
                         "--cors-allowed-origins", "https://app.example",
                         "https://b.example")
    try:
        g.wait_ready(1)
        pre = {"Origin": "https://app.example",
               "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization"}
        r = g.request("OPTIONS", "/v1/chat/completions", headers=pre)
        assert r.status == 204, r
        assert r.headers["access-control-allow-origin"] == \
            "https://app.example"
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"]
        r = g.request("OPTIONS", "/v1/chat/completions",
                      headers=dict(pre, Origin="https://evil.example"))
        assert "access-control-allow-origin" not in r.headers
        hdrs = dict(bearer("k"), Origin="https://b.example")
        r = g.post("/v1/chat/completions", chat(), headers=hdrs)
        assert r.status == 200
        assert r.headers["access-control-allow-origin"] == "https://b.example"
        assert "x-request-id" in r.headers["access-control-expose-headers"]
        r = g.post("/v1/chat/completions", dict(chat(), stream=True),
                   headers=hdrs)
        assert r.status == 200 and b"data:" in r.body
        assert r.headers["access-control-allow-origin"] == "https://b.example"
        r = g.post("/v1/chat/completions", chat(),
                   headers={"Origin": "https://b.example"})
        assert r.status == 401
        assert r.headers["access-control-allow-origin"] == "https://b.example"
        r = g.post("/v1/chat/completions", chat(),
                   headers=dict(bearer("k"), Origin="https://evil.example"))
        assert r.status == 200
        assert not any(h.startswith("access-control") for h in r.headers)
    finally:
        g.stop()
        w.stop()


TP = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def test_trace_context_reaches_the_worker(tmp_path):
    ew = EchoWorker("echo-model")
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", ew.url, "--api-key", "wk",
                         "--tenant-api-key", "acme:tk")
    try:
        g.wait_ready(1)
        body = {"model": "echo-model", "prompt": "x", "max_tokens": 1}
        tid = "4bf92f3577b34da6a3ce929d0e0e4736"
        r = g.post("/v1/completions", body, headers={
            "Authorization": "Bearer tk",
            "traceparent": f"00-{tid}-00f067aa0ba902b7-01",
            "tracestate": "congo=t61rcWkgMzE"})
        assert r.status == 200, r
        got = ew.received[-1]["headers"]
        m = TP.match(got["traceparent"])
        assert m and m.group(1) == tid and m.group(3) == "01"
        assert m.group(2) != "00f067aa0ba902b7"  # the gateway's span
        assert got["tracestate"] == "congo=t61rcWkgMzE"
        # The tenant key stays at the gateway; the worker gets its key.
        assert got["authorization"] == "Bearer wk"

        r = g.post("/v1/completions", body, headers={
            "Authorization": "Bearer wk", "traceparent": "00-bogus"})
        assert r.status == 200
        got = ew.received[-1]["headers"]
        m = TP.match(got["traceparent"])
        assert m and m.group(1) != "0" * 32 and m.group(3) == "00"
        assert "tracestate" not in got
    finally:
        g.stop()
        ew.stop()


def test_tenant_from_trusted_header(tmp_path):
    cfg = tmp_path / "limits.json"
    cfg.write_text(json.dumps({
        "default_policy": {"requests_per_minute": 6000,
                           "tokens_per_minute": 100000},
        "tenants": [{"tenant_key": "header:slow", "requests_per_minute": 6,
                     "tokens_per_minute": 100000, "burst": 2}]}))
    w = sim.start_simworker(tmp_path, "--model", "sim-model")
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url, "--trust-tenant-header",
                         "--tenant-rate-limit-enabled",
                         "--tenant-rate-limit-config", cfg)
    try:
        g.wait_ready(1)
        slow = [g.post("/v1/chat/completions", chat(),
                       headers={"x-smg-tenant-id": " slow "})
                for _ in range(5)]
        assert [r.status for r in slow] == [200, 200, 429, 429, 429]
        assert slow[2].json()["error"]["code"] == "tenant_rate_limited"
        assert int(slow[2].headers["retry-after"]) >= 1
        fast = [g.post("/v1/chat/completions", chat(),
                       headers={"x-smg-tenant-id": "fast"}).status
                for _ in range(5)]
        assert fast == [200] * 5
        m = g.metrics()
        assert 'smg_tenant_rate_limit_total{tenant="header:slow",' \
               'result="rejected"} 3' in m
        assert 'tenant="other",result="allowed"} 5' in m
    finally:
        g.stop()
        w.stop()
