"""The gateway never proxies to itself: the worker API refuses its own
listening address (and IPv4 literals in other than dotted-decimal form),
and a request that comes back through another gateway carries this one's
Via entry and is answered 508 loop_detected instead of recursing.
"""
import time

import gw
import sim
import util

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}


@util.skip_under_valgrind
def test_worker_api_refuses_self_and_odd_ip_forms(tmp_path):
    w = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            # SMG's code for every refusal is BAD_REQUEST; the message
            # says which rule refused.
            for url, why in [
                    (f"http://localhost:{g.port}", "gateway"),
                    (f"http://127.0.0.1:{g.port}/", "gateway"),
                    (f"http://0.0.0.0:{g.port}", "gateway"),
                    (f"http://2130706433:{g.port}", ""),
                    (f"http://0x7f000001:{g.port}", ""),
                    ("http://0177.0.0.1:9", ""),
                    ("ipc:///tmp/x.sock", "")]:
                r = g.post("/workers", {"url": url})
                assert r.status == 400, (url, r)
                assert r.json()["code"] == "BAD_REQUEST", (url, r)
                assert why in r.json()["error"], (url, r)
            ws = g.get("/workers").json()["workers"]
            assert [x["url"] for x in ws] == [w.url]
            # A request still goes to the real worker.
            assert g.post("/generate", GEN).status == 200
    except BaseException:
        w.proc.kill()
        raise
    w.stop()


@util.skip_under_valgrind
def test_loop_through_another_gateway_is_cut(tmp_path):
    a_dir = tmp_path / "a"
    b_dir = tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    with gw.start_gateway(a_dir, "--policy", "round_robin") as a:
        with gw.start_gateway(b_dir, "--policy", "round_robin",
                              "--worker-urls",
                              f"http://127.0.0.1:{a.port}") as b:
            r = a.post("/workers", {"url": f"http://127.0.0.1:{b.port}"})
            assert r.status == 202, r
            a.wait_ready(1)
            b.wait_ready(1)
            t = time.monotonic()
            r = a.post("/generate", GEN, timeout=10)
            took = time.monotonic() - t
            assert r.status == 508, r
            assert r.json()["error"]["code"] == "loop_detected", r
            assert took < 2.0 * util.TIMEOUT_MULT, took
            # B saw the request once and A twice: no recursion.
            assert a.log().count("loop_detected") <= 2
