"""The launcher contract: one parse, children watched and restarted, clean
shutdown, and the command-line front door (launch alias, --help,
--version)."""
import os
import re
import signal
import subprocess
import threading
import time

import pytest

import gw
import sim
import util


# Any policy will do; the launcher does not route.
RR = ("--policy", "round_robin")


def run_smg(tmp_path, *args, timeout=10):
    argv = [util.binary("smg")] + [str(a) for a in args]
    return subprocess.run(argv, capture_output=True, text=True,
                          timeout=timeout * util.TIMEOUT_MULT,
                          start_new_session=True)


BAD_LINES = [
    (["--policy", "bogus", "--worker-urls", "http://127.0.0.1:1"],
     "--policy"),
    (["--no-such-flag", "--worker-urls", "http://127.0.0.1:1"],
     "--no-such-flag"),
    (["--pd-disaggregation", "--decode-policy", "bucket",
      "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"],
     "--decode-policy"),
]


@pytest.mark.parametrize("args,flag", BAD_LINES,
                         ids=["bad-policy", "unknown-flag", "startup-rule"])
def test_bad_command_line_starts_nothing(tmp_path, args, flag):
    run_dir = tmp_path / "run"
    state_dir = tmp_path / "state"
    r = run_smg(tmp_path, "--run-dir", run_dir, "--state-dir", state_dir,
                "--port", util.free_port(), *args)
    assert r.returncode == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert flag in lines[0], r.stderr
    assert not run_dir.exists() and not state_dir.exists()
    assert gw.processes_mentioning(str(tmp_path)) == []


def test_help_and_version(tmp_path):
    r = run_smg(tmp_path, "--help")
    assert r.returncode == 0, r
    text = r.stdout
    # One flag of every group of the command line.
    for flag in ("--host", "--prometheus-port", "--worker-urls",
                 "--pd-disaggregation", "--policy", "--cache-threshold",
                 "--load-monitor-interval", "--worker-overload-protection",
                 "--health-check-interval-secs", "--retry-max-retries",
                 "--cb-failure-threshold", "--max-payload-size",
                 "--api-key", "--tls-cert-path", "--frontends", "--run-dir",
                 "--state-dir"):
        assert flag in text, f"--help lacks {flag}"
    for args in (["--version"], ["-V"], ["launch", "--version"]):
        r = run_smg(tmp_path, *args)
        assert r.returncode == 0, r
        assert "0.1.0" in r.stdout, r


def test_starts_everything_and_sigterm_cleans_up(tmp_path):
    g = gw.start_gateway(tmp_path, *RR, "--worker-urls",
                         "http://127.0.0.1:1", frontends=2)
    with g:
        pids = g.pids()
        assert len(pids["broker"]) == 1 and len(pids["poller"]) == 1
        assert len(pids["frontend"]) == 2
        log = g.log()
        assert (f"started broker pid {pids['broker'][0]}, poller pid "
                f"{pids['poller'][0]}, 2 frontends on 127.0.0.1:{g.port}"
                in log), log
        assert os.path.exists(os.path.join(g.run_dir, "smg.shm"))
        assert oct(os.stat(g.run_dir).st_mode & 0o777) == "0o700"
        assert os.path.isdir(g.state_dir)
        # Frontends get their slot, everyone the same flags.
        for i, pid in enumerate(sorted(pids["frontend"],
                                       key=lambda p: _slot_of(p))):
            assert _slot_of(pid) == i
        g.stop()
    assert not os.path.exists(g.run_dir) or os.listdir(g.run_dir) == []
    assert gw.processes_mentioning(str(tmp_path)) == []


def _slot_of(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    return int(argv[argv.index("--frontend-slot") + 1])


def test_launch_alias(tmp_path):
    with gw.start_gateway(tmp_path, *RR, command="launch") as g:
        assert g.get("/liveness").status == 200
        g.stop()


def test_killed_frontend_is_restarted(tmp_path):
    with gw.start_gateway(tmp_path, *RR, frontends=2) as g:
        before = g.pids()
        victim = before["frontend"][0]
        os.kill(victim, signal.SIGKILL)

        def replaced():
            now = g.pids()["frontend"]
            return len(now) == 2 and victim not in now and now
        after = util.wait_for(replaced, timeout=10,
                              what="a new frontend")
        new = [p for p in after if p not in before["frontend"]][0]
        log = g.log()
        assert f"pid {victim} killed by signal 9" in log, log
        assert f"restarted smg-frontend[slot {_slot_of(new)}]: pid {new}" \
            in log, log
        # Serving again, on both slots.
        util.wait_for(lambda: g.get("/liveness").status == 200,
                      what="liveness after restart")
        assert g.pids()["broker"] == before["broker"]
        g.stop()


def test_killed_broker_and_poller_are_restarted(tmp_path):
    with gw.start_gateway(tmp_path, *RR) as g:
        before = g.pids()
        os.kill(before["broker"][0], signal.SIGKILL)
        os.kill(before["poller"][0], signal.SIGKILL)

        def replaced():
            now = g.pids()
            return (len(now["broker"]) == 1 and len(now["poller"]) == 1 and
                    now["broker"] != before["broker"] and
                    now["poller"] != before["poller"])
        util.wait_for(replaced, timeout=10, what="broker and poller back")
        # The child can be seen before the launcher has logged its fork.
        util.wait_for(lambda: "restarted smg-broker" in g.log() and
                      "restarted smg-poller" in g.log(), timeout=5,
                      what="both restarts logged")
        assert g.get("/liveness").status == 200
        g.stop()


def test_launcher_sigkill_takes_children_down(tmp_path):
    g = gw.start_gateway(tmp_path, *RR, frontends=2)
    children = [p for v in g.pids().values() for p in v]
    try:
        g.proc.kill()
        util.wait_for(lambda: not any(gw.pid_alive(p) for p in children),
                      timeout=5, what="orphans to exit")
    finally:
        g.kill()


def test_second_launcher_on_same_run_dir_refused(tmp_path):
    with gw.start_gateway(tmp_path, *RR) as g:
        r = run_smg(tmp_path, "--run-dir", g.run_dir, "--state-dir",
                    g.state_dir, "--host", "127.0.0.1", "--port",
                    util.free_port(), "--prometheus-port",
                    util.free_port())
        assert r.returncode != 0
        assert "another smg runs" in r.stderr, r.stderr
        assert g.get("/liveness").status == 200
        g.stop()


def _worker_load(g, wid):
    r = g.get(f"/workers/{wid}", timeout=2)
    return r.json().get("load") if r.status == 200 else None


def _active_gauge(g, url):
    for line in g.metrics().splitlines():
        m = re.match(r'smg_worker_requests_active\{worker="([^"]*)"\} (\d+)',
                     line)
        if m and m.group(1) == url:
            return int(m.group(2))
    return None


def test_restarted_broker_sees_inflight(tmp_path):
    w = sim.start_simworker(tmp_path)
    try:
        with gw.start_gateway(tmp_path, *RR, "--worker-urls", w.url) as g:
            g.wait_ready(1)
            wid = g.get("/workers").json()["workers"][0]["id"]
            result = {}

            def hold():
                result["r"] = g.post("/generate", {
                    "text": "hold me", "sim_hold_ms": 6000,
                    "sampling_params": {"max_new_tokens": 1}}, timeout=30)
            t = threading.Thread(target=hold)
            t.start()
            try:
                util.wait_for(lambda: _worker_load(g, wid) == 1,
                              what="the request in flight")
                old = g.pids()["broker"]
                os.kill(old[0], signal.SIGKILL)
                util.wait_for(lambda: g.pids()["broker"] not in ([], old),
                              what="a new broker")
                # Answered by the new broker, from the frontends' counters.
                util.wait_for(lambda: _worker_load(g, wid) == 1,
                              what="in-flight seen by the new broker")
                assert _active_gauge(g, w.url) == 1
            finally:
                t.join(30 * util.TIMEOUT_MULT)
            assert result["r"].status == 200, result["r"]
            util.wait_for(lambda: _worker_load(g, wid) == 0,
                          what="in-flight back to 0")
            assert "restarted smg-broker" in g.log()
            g.stop()
    finally:
        w.stop()


def test_sighup_is_a_noop_under_load(tmp_path):
    """SIGHUP, to the launcher and to every child, again and again while a
    client sends chat completions: no process changes, no request fails,
    and each process logs that it ignored the signal."""
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(2)]
    try:
        with gw.start_gateway(tmp_path, *RR, "--worker-urls",
                              *[w.url for w in ws], frontends=2) as g:
            g.wait_ready(2)
            before = g.pids()
            everyone = [g.proc.pid] + [p for v in before.values() for p in v]
            body = {"model": "sim-model", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hello"}]}
            done, failed = [], []
            stop = threading.Event()

            def client():
                while not stop.is_set() or len(done) < 200:
                    try:
                        r = g.post("/v1/chat/completions", body, timeout=10)
                        (done if r.status == 200 else failed).append(r)
                    except OSError as e:
                        failed.append(e)
            t = threading.Thread(target=client)
            t.start()
            try:
                util.wait_for(lambda: len(done) + len(failed) >= 20,
                              what="the client loop under way")
                rounds = 5
                for _ in range(rounds):
                    for pid in everyone:
                        os.kill(pid, signal.SIGHUP)
                    time.sleep(0.1)
                sent_at = len(done) + len(failed)
                # Requests after the last SIGHUP too.
                util.wait_for(lambda: len(done) + len(failed) >= sent_at + 20,
                              timeout=20, what="requests after the SIGHUPs")
            finally:
                stop.set()
                t.join(60 * util.TIMEOUT_MULT)
            assert not t.is_alive()
            assert failed == [], failed[:5]
            assert len(done) >= 200
            assert g.pids() == before
            log = g.log()
            for pid in everyone:
                assert f"[{pid}]: sighup_cb: SIGHUP ignored" in log, log[-3000:]
            assert "restarted " not in log and "killed by signal" not in log, \
                log[-3000:]
            g.stop()
    finally:
        for w in ws:
            w.stop()
