"""Shutdown and ownership under the launcher: SIGTERM drains in-flight
requests for --shutdown-grace-period-secs, one gateway per host:port, and a
port that cannot be bound ends the start at once."""
import os
import signal
import socket
import subprocess
import threading
import time

import gw
import sim
import util

RR = ("--policy", "round_robin")


def run_smg(*args, timeout=20):
    argv = [util.binary("smg")] + [str(a) for a in args]
    return subprocess.run(argv, capture_output=True, text=True,
                          timeout=timeout * util.TIMEOUT_MULT,
                          start_new_session=True)


def _hold(g, ms):
    return g.post("/generate", {"text": "hold me", "sim_hold_ms": ms,
                                "sampling_params": {"max_new_tokens": 1}},
                  timeout=60)


@util.skip_under_valgrind
def test_sigterm_drains_long_requests(tmp_path):
    """Six 7 s requests in flight, SIGTERM to the launcher with a 10 s
    grace: every one completes, then everything exits 0 and cleans up."""
    w = sim.start_simworker(tmp_path)
    try:
        g = gw.start_gateway(tmp_path, *RR, "--worker-urls", w.url,
                             "--shutdown-grace-period-secs", "10",
                             frontends=2)
        try:
            g.wait_ready(1)
            children = [p for v in g.pids().values() for p in v]
            results = []
            lock = threading.Lock()

            def one():
                try:
                    r = _hold(g, 7000)
                    with lock:
                        results.append(r.status)
                except OSError as e:
                    with lock:
                        results.append(repr(e))
            ts = [threading.Thread(target=one) for _ in range(6)]
            for t in ts:
                t.start()
            wid = g.get("/workers").json()["workers"][0]["id"]
            util.wait_for(
                lambda: g.get(f"/workers/{wid}").json().get("load") == 6,
                what="six requests in flight")
            t0 = time.monotonic()
            g.proc.send_signal(signal.SIGTERM)
            # New connections are refused at once while the old drain.
            util.wait_for(lambda: _refused(g.port), timeout=5,
                          what="the listeners closed")
            for t in ts:
                t.join(30 * util.TIMEOUT_MULT)
            rc = g.proc.wait(timeout=20)
            took = time.monotonic() - t0
            g.stopped = True
            g.proc._log.close()
            assert results == [200] * 6, results
            assert rc == 0, g.log()[-3000:]
            # Held about 7 s from the start, far less than the kill time.
            assert took < 10 + 3 * util.TIMEOUT_MULT, took
            log = g.log()
            assert "killing" not in log and "cut" not in log, log[-3000:]
            assert "frontends drain for up to 10 s" in log, log[-3000:]
            g.proc.check_log()
            assert not [p for p in children if gw.pid_alive(p)]
            assert not gw.sockets_in(g.run_dir)
            assert not os.path.exists(os.path.join(g.run_dir, "smg.shm"))
        finally:
            g.kill()
    finally:
        w.stop()


def _refused(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def test_grace_period_bounds_the_drain(tmp_path):
    """A request longer than the grace period is cut at its end (by the
    frontend) and the launcher exits 0 soon after, without SIGKILL."""
    w = sim.start_simworker(tmp_path)
    try:
        g = gw.start_gateway(tmp_path, *RR, "--worker-urls", w.url,
                             "--shutdown-grace-period-secs", "2")
        try:
            g.wait_ready(1)
            out = {}

            def one():
                try:
                    out["r"] = _hold(g, 20000)
                except OSError as e:
                    out["r"] = e
            t = threading.Thread(target=one)
            t.start()
            wid = g.get("/workers").json()["workers"][0]["id"]
            util.wait_for(
                lambda: g.get(f"/workers/{wid}").json().get("load") == 1,
                what="the request in flight")
            t0 = time.monotonic()
            g.proc.send_signal(signal.SIGTERM)
            rc = g.proc.wait(timeout=20)
            took = time.monotonic() - t0
            t.join(30 * util.TIMEOUT_MULT)
            g.stopped = True
            g.proc._log.close()
            assert rc == 0
            assert 1.5 < took < 2 + 4 * util.TIMEOUT_MULT, took
            log = g.log()
            assert "grace period over, 1 requests cut" in log, log[-3000:]
            assert "still running" not in log, log[-3000:]
            g.proc.check_log()
        finally:
            g.kill()
    finally:
        w.stop()


def test_second_gateway_on_same_port_exits_2(tmp_path):
    with gw.start_gateway(tmp_path, *RR, frontends=2) as g:
        other = tmp_path / "other"
        r = run_smg("--host", "127.0.0.1", "--port", g.port,
                    "--prometheus-port", util.free_port(),
                    "--run-dir", other / "run", "--state-dir",
                    other / "state", *RR)
        assert r.returncode == 2, r
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, r.stderr
        assert f"127.0.0.1:{g.port} is already served by the smg-c " \
               f"gateway of pid {g.proc.pid} (run dir {g.run_dir})" \
               in lines[0], r.stderr
        assert not (other / "run").exists()
        # The first one serves on, with all of its processes.
        assert g.get("/liveness").status == 200
        assert g.all_started()
        g.stop()


def test_stray_frontend_and_broker_refused(tmp_path):
    """A broker or frontend of another run dir, started by hand on a port
    a gateway holds, exits 2 instead of sharing the listener."""
    with gw.start_gateway(tmp_path, *RR) as g:
        other = tmp_path / "other"
        common = ["--host", "127.0.0.1", "--port", str(g.port),
                  "--prometheus-port", str(util.free_port()),
                  "--run-dir", str(other / "run"),
                  "--state-dir", str(other / "state"), *RR]
        for name, extra in (("smg-frontend", ["--frontend-slot", "0"]),
                            ("smg-broker", [])):
            r = subprocess.run([util.binary(name)] + common + extra,
                               capture_output=True, text=True,
                               timeout=20 * util.TIMEOUT_MULT,
                               start_new_session=True)
            assert r.returncode == 2, (name, r)
            assert f"already served by the smg-c gateway of pid " \
                   f"{g.proc.pid}" in r.stderr, r.stderr
        assert g.get("/liveness").status == 200
        g.stop()


def test_duplicate_frontend_slot_refused(tmp_path):
    """A second frontend of one gateway on a slot a live frontend holds
    (an orphan left by a killed supervisor) exits 2 naming the holder."""
    with gw.start_gateway(tmp_path, *RR) as g:
        holder = g.pids()["frontend"][0]
        r = subprocess.run([util.binary("smg-frontend")] + g.argv[1:] +
                           ["--frontend-slot", "0"],
                           capture_output=True, text=True,
                           timeout=20 * util.TIMEOUT_MULT,
                           start_new_session=True)
        assert r.returncode == 2, r
        assert f"frontend slot 0 is held by live pid {holder}" in r.stderr, \
            r.stderr
        assert g.pids()["frontend"] == [holder]
        g.stop()


def test_busy_port_exits_at_once(tmp_path):
    """The main port held by another program: exit non-zero within
    seconds, one line naming the port, nothing left running."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        t0 = time.monotonic()
        r = run_smg("--host", "127.0.0.1", "--port", port,
                    "--prometheus-port", util.free_port(),
                    "--run-dir", tmp_path / "run",
                    "--state-dir", tmp_path / "state", *RR)
        took = time.monotonic() - t0
        assert r.returncode == 1, r
        assert took < 5 * util.TIMEOUT_MULT, took
        assert f"cannot listen on 127.0.0.1:{port}: Address already in use" \
            in r.stderr, r.stderr
        assert gw.processes_mentioning(str(tmp_path)) == []
        assert not (tmp_path / "run").exists()
    finally:
        s.close()


def test_service_discovery_refused(tmp_path, monkeypatch):
    """A gateway that could never discover a worker is refused with exit 2
    and one line, not started with 0 workers: --service-discovery without
    its mode's selector, or outside a pod with no SMG_K8S_API; the
    selectors alone (inert without it) are warned about."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("SMG_K8S_API", raising=False)
    for args, why in (
            (["--service-discovery"], "needs --selector"),
            (["--service-discovery", "--prefill-selector", "r=p",
              "--decode-selector", "r=d", "--pd-disaggregation"],
             "no Kubernetes API")):
        r = run_smg("--run-dir", tmp_path / "run", "--state-dir",
                    tmp_path / "state", "--port", util.free_port(), *args)
        assert r.returncode == 2, r
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and why in lines[0], r.stderr
        assert not (tmp_path / "run").exists()
    r = run_smg("--run-dir", tmp_path / "run", "--state-dir",
                tmp_path / "state", "--port", util.free_port(),
                "--selector", "app=sglang", "-n")
    assert r.returncode == 0, r
    assert "no effect without --service-discovery" in r.stderr


def test_admin_fails_fast_without_broker(tmp_path):
    """A frontend whose broker is not running answers the worker API 503
    within a second instead of waiting for the IPC timeout."""
    port = util.free_port()
    argv = [util.binary("smg-frontend"), "--host", "127.0.0.1", "--port",
            str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(util.free_port()),
            "--run-dir", str(tmp_path / "run"),
            "--state-dir", str(tmp_path / "state"), "--frontends", "1",
            "--frontend-slot", "0", *RR]
    fe = util.Proc("frontend", argv, tmp_path)
    try:
        util.wait_for(lambda: util.get(port, "/liveness", timeout=2).status
                      == 200, what="frontend liveness")
        for method, path, body in (("GET", "/workers", None),
                                   ("POST", "/workers",
                                    {"url": "http://127.0.0.1:9"})):
            t0 = time.monotonic()
            r = util.request(port, method, path, body=body, timeout=15)
            took = time.monotonic() - t0
            assert r.status == 503, r
            assert b"broker_unavailable" in r.body, r
            assert took <= 1.0 * util.TIMEOUT_MULT, took
        fe.stop()
    finally:
        fe.kill()
