"""TLS on both sides of the gateway.

A client talks HTTPS to the gateway (--tls-cert-path/--tls-key-path), and
the gateway talks HTTPS to a worker (https:// worker URL verified against
--ca-cert-paths, presenting --client-cert-path/--client-key-path). The
worker side is a simworker behind a small TLS terminator run by the test
(asyncio + ssl) that requires the client certificate. Everything is signed
by a CA made with the openssl CLI in the test's temp dir. Certificates
name localhost (DNS SAN), and the worker URL uses https://localhost:PORT.
"""
import asyncio
import http.client
import json
import socket
import ssl
import subprocess
import threading

import gw
import sim
import util

GEN = {"text": "hello over tls", "sampling_params": {"max_new_tokens": 3}}


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_pki(d):
    """CA, a server certificate for localhost and a client certificate."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=smg-c test CA", cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
        "basicConstraints=CA:FALSE\n"
        "extendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text(
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for name, cn in (("server", "localhost"), ("client", "smg-c gateway")):
        openssl("req", *ec, "-keyout", f"{name}.key", "-out",
                f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem",
                "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=d)
    return {k: str(d / v) for k, v in (
        ("ca", "ca.pem"), ("cert", "server.pem"), ("key", "server.key"),
        ("client_cert", "client.pem"), ("client_key", "client.key"))}


class TlsTerminator:
    """HTTPS on 127.0.0.1:port forwarded as plain TCP to a backend port.

    With client_ca, clients must present a certificate signed by it."""

    def __init__(self, cert, key, backend_port, client_ca=None):
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(cert, key)
        if client_ca:
            self.ctx.verify_mode = ssl.CERT_REQUIRED
            self.ctx.load_verify_locations(client_ca)
        self.backend_port = backend_port
        self.handshakes = 0
        self.writers = set()
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.started.wait(10):
            raise RuntimeError("TLS terminator did not start")

    async def _pump(self, reader, writer):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, ssl.SSLError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.close()
            except (OSError, RuntimeError):
                pass

    async def _client(self, creader, cwriter):
        self.handshakes += 1
        self.writers.add(cwriter)
        try:
            breader, bwriter = await asyncio.open_connection(
                "127.0.0.1", self.backend_port)
        except OSError:
            cwriter.close()
            return
        try:
            await asyncio.gather(self._pump(creader, bwriter),
                                 self._pump(breader, cwriter))
        finally:
            self.writers.discard(cwriter)

    def _run(self):
        asyncio.set_event_loop(self.loop)

        async def start():
            self.server = await asyncio.start_server(
                self._client, "127.0.0.1", 0, ssl=self.ctx)
            self.port = self.server.sockets[0].getsockname()[1]
            self.started.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()
        self.server.close()
        tasks = asyncio.all_tasks(self.loop)
        for t in tasks:
            t.cancel()
        self.loop.run_until_complete(
            asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    def swap_certificate(self, cert, key):
        """Serves another certificate from now on and drops every open
        connection, so clients must handshake again."""
        done = threading.Event()

        def swap():
            try:
                self.ctx.load_cert_chain(cert, key)
                # Aborting a transport runs callbacks that may touch
                # self.writers: iterate over a copy. A transport that is
                # already closing has nothing left to abort.
                for wr in list(self.writers):
                    t = wr.transport
                    if t is None or t.is_closing():
                        continue
                    try:
                        t.abort()
                    except (AttributeError, OSError, RuntimeError):
                        pass
                self.writers.clear()
            finally:
                done.set()

        self.loop.call_soon_threadsafe(swap)
        assert done.wait(5 * util.TIMEOUT_MULT)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class TlsGateway(gw.Gateway):
    """The gateway harness, speaking HTTPS to the main listener."""

    def __init__(self, tmp_path, args, ca):
        super().__init__(tmp_path, args)
        self.client_ctx = ssl.create_default_context(cafile=ca)

    def connection(self, timeout=10.0):
        return http.client.HTTPSConnection(
            "localhost", self.port, timeout=timeout * util.TIMEOUT_MULT,
            context=self.client_ctx)

    def request(self, method, path, body=None, headers=None, timeout=10.0):
        conn = self.connection(timeout)
        try:
            hdrs = dict(headers or {})
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                hdrs.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=body, headers=hdrs)
            r = conn.getresponse()
            data = r.read()
            return util.Response(
                r.status, {k.lower(): v for k, v in r.getheaders()}, data)
        finally:
            conn.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body=body, **kw)


def test_https_client_and_https_worker(tmp_path):
    pki = make_pki(tmp_path)
    w = sim.start_simworker(tmp_path)
    term = TlsTerminator(pki["cert"], pki["key"], w.port,
                         client_ca=pki["ca"])
    wurl = f"https://localhost:{term.port}"
    g = TlsGateway(tmp_path, [
        "--policy", "round_robin", "--worker-urls", wurl,
        "--tls-cert-path", pki["cert"], "--tls-key-path", pki["key"],
        "--ca-cert-paths", pki["ca"],
        "--client-cert-path", pki["client_cert"],
        "--client-key-path", pki["client_key"]], pki["ca"])
    try:
        g.wait_live()
        g.wait_ready(1)
        workers = g.get("/workers").json()["workers"]
        assert [x["url"] for x in workers] == [wurl]

        # Keep-alive over TLS: several requests on one connection.
        conn = g.connection()
        for _ in range(5):
            conn.request("POST", "/generate", body=json.dumps(GEN),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            body = r.read()
            assert r.status == 200, body
            assert r.getheader("x-smg-routed-worker-id") == wurl
            assert r.getheader("x-request-id").startswith("gnt-")
            assert "text" in json.loads(body)
        assert conn.sock.version() is not None  # really TLS
        conn.close()

        # A stream relayed chunk by chunk through both TLS legs.
        conn = g.connection()
        conn.request("POST", "/v1/chat/completions", body=json.dumps({
            "model": "sim-model", "stream": True,
            "messages": [{"role": "user", "content": "stream me"}],
            "max_tokens": 8}), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        assert r.getheader("content-type") == "text/event-stream"
        events = [ln for ln in r.read().split(b"\n") if
                  ln.startswith(b"data:")]
        conn.close()
        assert events[-1].strip() == b"data: [DONE]"
        assert len(events) >= 4

        # The worker really was reached through the terminator.
        assert term.handshakes >= 1
        assert w.stats()["requests"] >= 6

        # Plain HTTP on the TLS port gets no HTTP answer; the gateway
        # keeps serving HTTPS afterwards.
        s = socket.create_connection(("127.0.0.1", g.port), timeout=3)
        s.sendall(b"GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            reply = s.recv(100)
        except OSError:
            reply = b""
        s.close()
        assert not reply.startswith(b"HTTP/1.1 200")
        assert g.get("/liveness").status == 200

        # A client that does not trust the gateway's CA fails to connect.
        bad = http.client.HTTPSConnection(
            "localhost", g.port, timeout=5,
            context=ssl.create_default_context())
        try:
            bad.request("GET", "/liveness")
            raise AssertionError("untrusted certificate accepted")
        except ssl.SSLCertVerificationError:
            pass
        finally:
            bad.close()
        assert g.post("/generate", GEN).status == 200
        g.stop()
    except BaseException:
        g.kill()
        raise
    finally:
        term.stop()
        w.stop()


def test_https_worker_with_untrusted_certificate(tmp_path):
    """Certificates are verified against --ca-cert-paths: a worker whose
    certificate is signed by another CA never gets a request, neither at
    registration (it stays Pending) nor once Ready (the frontend refuses
    the handshake and answers with the spec's error)."""
    pki = make_pki(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    other_pki = make_pki(other)
    w1 = sim.start_simworker(tmp_path)
    w2 = sim.start_simworker(tmp_path)
    t1 = TlsTerminator(other_pki["cert"], other_pki["key"], w1.port)
    t2 = TlsTerminator(pki["cert"], pki["key"], w2.port)
    url1 = f"https://localhost:{t1.port}"
    url2 = f"https://localhost:{t2.port}"
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", url1, url2,
                              "--retry-max-retries", "2",
                              "--retry-initial-backoff-ms", "1",
                              "--ca-cert-paths", pki["ca"]) as g:
            g.wait_ready(1)
            for _ in range(4):
                r = g.post("/generate", GEN)
                assert r.status == 200, r
                assert r.headers["x-smg-routed-worker-id"] == url2
            ws = {x["url"]: x for x in g.get("/workers").json()["workers"]}
            assert ws[url1]["status"] == "Pending"
            assert ws[url2]["status"] == "Ready"

            # The Ready worker now presents an untrusted certificate.
            t2.swap_certificate(other_pki["cert"], other_pki["key"])
            r = g.post("/generate", GEN)
            assert r.status == 500, r
            err = r.json()["error"]
            assert err["code"] == "call_upstream_connection_failed"
            assert r.headers["x-smg-error-code"] == err["code"]
            assert w1.stats()["requests"] == 0
            assert w2.stats()["requests"] == 4
            assert g.get("/liveness").status == 200
            assert any("smg-frontend" in ln and "not correctly signed" in ln
                       for ln in g.log().splitlines())
            g.stop()
    finally:
        t1.stop()
        t2.stop()
        w1.stop()
        w2.stop()
