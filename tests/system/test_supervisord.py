"""deploy/supervisord/smg.conf under the real supervisord.

The shipped program file is rewritten only where a test must differ (the
binaries of this build, free ports, the temp dir for run, state and log
dirs, no `user=`, the simulated workers' URLs) and run by its own
supervisord (Debian package supervisor) with its own socket in the temp
dir, never the system service. Under a client loop: a rolling restart of
every frontend, then of broker and poller, with 0 failed requests; kill -9
of each program, which supervisord replaces; `stop all` and `shutdown`
leave no process behind.
"""
import configparser
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest

import gw
import sim
import util

CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                    "deploy", "supervisord", "smg.conf")
SUPERVISORD = shutil.which("supervisord")
SUPERVISORCTL = shutil.which("supervisorctl")

pytestmark = pytest.mark.skipif(
    SUPERVISORD is None or SUPERVISORCTL is None,
    reason="supervisord not installed (Debian package supervisor; "
           "scripts/install-deps.sh installs it)")


def _shipped():
    cp = configparser.RawConfigParser(inline_comment_prefixes=None,
                                      strict=True)
    cp.read(CONF)
    return cp


def _argv_of(section):
    return section["command"].split()


def test_shipped_file_is_consistent():
    """One program per process, no [group:] (update would restart them
    all), identical flags, frontends waited on longer than they drain."""
    cp = _shipped()
    progs = [s for s in cp.sections() if s.startswith("program:")]
    assert not [s for s in cp.sections() if s.startswith("group:")]
    fes = sorted(s for s in progs if s.startswith("program:smg-frontend-"))
    assert set(progs) == {"program:smg-broker", "program:smg-poller",
                          *fes}
    base = None
    for s in progs:
        argv = _argv_of(cp[s])
        name = s.split(":")[1]
        binary = "smg-frontend" if name.startswith("smg-frontend-") \
            else name
        assert argv[0] == "/usr/local/bin/" + binary
        flags = argv[1:]
        if "frontend" in s:
            i = flags.index("--frontend-slot")
            assert s == f"program:smg-frontend-{flags[i + 1]}"
            flags = flags[:i] + flags[i + 2:]
        assert base is None or flags == base, s
        base = flags
        assert cp[s]["user"] == "smg"
        assert cp[s]["stdout_logfile"].startswith("/var/log/smg/")
    assert base[base.index("--frontends") + 1] == str(len(fes))
    grace = int(base[base.index("--shutdown-grace-period-secs") + 1])
    for s in fes:
        assert int(cp[s]["stopwaitsecs"]) > grace


class Supervised:
    """The shipped file, rewritten for this test, under its own
    supervisord."""

    def __init__(self, tmp_path, worker_urls):
        self.tmp = tmp_path
        self.port = util.free_port()
        self.metrics_port = util.free_port()
        self.run_dir = str(tmp_path / "run")
        self.state_dir = str(tmp_path / "state")
        self.log_dir = tmp_path / "log"
        self.log_dir.mkdir()
        self.sock = str(tmp_path / "supervisor.sock")
        self.conf = str(tmp_path / "supervisord.conf")
        cp = _shipped()
        for s in cp.sections():
            sec = cp[s]
            cmd = sec["command"]
            cmd = cmd.replace("/usr/local/bin/", util.BUILD_DIR + "/")
            cmd = re.sub(r"--port 30000", f"--port {self.port}", cmd)
            cmd = re.sub(r"--prometheus-port 29000",
                         f"--prometheus-port {self.metrics_port}", cmd)
            cmd = cmd.replace("--run-dir /run/smg",
                              f"--run-dir {self.run_dir}")
            cmd = cmd.replace("--state-dir /var/lib/smg",
                              f"--state-dir {self.state_dir}")
            cmd = re.sub(r"--worker-urls( http://\S+)+",
                         "--worker-urls " + " ".join(worker_urls), cmd)
            cmd = cmd.replace("--policy cache_aware",
                              "--policy round_robin")
            cmd = cmd.replace("--frontends",
                              "--host 127.0.0.1 --prometheus-host "
                              "127.0.0.1 --frontends")
            sec["command"] = " ".join(cmd.split())
            sec["stdout_logfile"] = sec["stdout_logfile"].replace(
                "/var/log/smg", str(self.log_dir))
            del sec["user"]
        cp["supervisord"] = {
            "logfile": str(tmp_path / "supervisord.log"),
            "pidfile": str(tmp_path / "supervisord.pid"),
            "childlogdir": str(self.log_dir),
            "nodaemon": "true",
        }
        cp["unix_http_server"] = {"file": self.sock, "chmod": "0700"}
        cp["supervisorctl"] = {"serverurl": f"unix://{self.sock}"}
        cp["rpcinterface:supervisor"] = {
            "supervisor.rpcinterface_factory":
            "supervisor.rpcinterface:make_main_rpcinterface"}
        with open(self.conf, "w") as f:
            cp.write(f)
        self.programs = [s.split(":")[1] for s in cp.sections()
                         if s.startswith("program:")]
        self.proc = util.Proc("supervisord",
                              [SUPERVISORD, "-n", "-c", self.conf], tmp_path)

    def ctl(self, *args, check=True, timeout=60):
        r = subprocess.run([SUPERVISORCTL, "-c", self.conf, *args],
                           capture_output=True, text=True,
                           timeout=timeout * util.TIMEOUT_MULT)
        if check:
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    def status(self):
        """{program: (state, pid or None)}"""
        out = {}
        for line in self.ctl("status", check=False).splitlines():
            f = line.split()
            if len(f) >= 2:
                m = re.search(r"pid (\d+)", line)
                out[f[0]] = (f[1], int(m.group(1)) if m else None)
        return out

    def wait_running(self, timeout=30):
        def all_running():
            st = self.status()
            return len(st) == len(self.programs) and \
                all(v[0] == "RUNNING" for v in st.values()) and st
        return util.wait_for(all_running, timeout=timeout,
                             what="every program RUNNING")

    def logs(self):
        text = ""
        for name in sorted(os.listdir(self.log_dir)):
            with open(self.log_dir / name, errors="replace") as f:
                text += f"--- {name}\n" + f.read()[-3000:]
        return text


class Client:
    """A chat-completion loop on fresh connections; counts outcomes."""

    def __init__(self, port):
        self.port = port
        self.ok = 0
        self.failed = []
        self.stop_ev = threading.Event()
        self.t = threading.Thread(target=self.run)
        self.t.start()

    def run(self):
        body = {"model": "sim-model", "max_tokens": 4,
                "messages": [{"role": "user", "content": "hello"}]}
        while not self.stop_ev.is_set():
            try:
                r = util.post(self.port, "/v1/chat/completions", body,
                              timeout=10)
                if r.status == 200:
                    self.ok += 1
                else:
                    self.failed.append(r)
            except OSError as e:
                self.failed.append(e)

    def advance(self, n=20):
        """Waits for n more successes."""
        target = self.ok + n
        util.wait_for(lambda: self.ok >= target, timeout=30,
                      what=f"{n} more requests")

    def stop(self):
        self.stop_ev.set()
        self.t.join(30 * util.TIMEOUT_MULT)
        assert not self.t.is_alive()


@util.skip_under_valgrind
def test_supervisord_restarts_kills_and_stop(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(2)]
    try:
        sv = Supervised(tmp_path, [w.url for w in ws])
        client = None
        try:
            first = sv.wait_running()
            util.wait_for(
                lambda: util.get(sv.port, "/readiness", timeout=2).status
                == 200, what="gateway ready")
            util.wait_for(
                lambda: len([w for w in util.get(sv.port, "/workers")
                             .json()["workers"]
                             if w["status"] == "Ready"]) == 2,
                what="2 Ready workers")
            client = Client(sv.port)
            client.advance()

            # Rolling restart, one program at a time: no request fails.
            fes = sorted(p for p in sv.programs if "frontend" in p)
            for name in fes + ["smg-broker", "smg-poller"]:
                before = sv.status()[name][1]
                sv.ctl("restart", name)
                st = sv.wait_running()
                assert st[name][1] != before
                assert not gw.pid_alive(before)
                client.advance()
            assert client.failed == [], client.failed[:5]
            rolled = client.ok

            # kill -9 of each: supervisord starts a new one. Broker and
            # poller die without a failed request (frontends route on
            # their own meanwhile); a frontend killed mid-request resets
            # that connection and those queued on its listener, nothing
            # answers with an error status.
            cut = {}
            for name in sv.programs:
                victim = sv.status()[name][1]
                n0 = len(client.failed)
                os.kill(victim, signal.SIGKILL)
                util.wait_for(
                    lambda: sv.status()[name][0] == "RUNNING" and
                    sv.status()[name][1] not in (None, victim),
                    timeout=30, what=f"{name} replaced")
                client.advance()
                cut[name] = client.failed[n0:]
            util.wait_for(
                lambda: util.get(sv.port, "/readiness", timeout=2).status
                == 200, what="ready after the kills")
            client.advance(50)
            client.stop()
            assert cut["smg-broker"] == [] and cut["smg-poller"] == [], cut
            for name in fes:
                assert len(cut[name]) <= 3 and \
                    all(isinstance(e, OSError) for e in cut[name]), cut
            assert client.ok > rolled + 50

            # stop all: every process gone; shutdown: supervisord too.
            pids = [v[1] for v in sv.status().values()]
            pids += [v[1] for v in first.values()]
            sv.ctl("stop", "all", timeout=120)
            st = sv.status()
            assert all(v[0] == "STOPPED" for v in st.values()), st
            assert not [p for p in pids if gw.pid_alive(p)], \
                [(p, util.process_name(p)) for p in pids if gw.pid_alive(p)]
            sv.ctl("shutdown")
            sv.proc.wait(timeout=30)
            sims = {w.proc.pid for w in ws}
            assert [p for p in gw.processes_mentioning(str(tmp_path))
                    if p not in sims] == []
            text = sv.logs()
            for mark in util.SANITIZER_MARKS:
                assert mark not in text, text
            assert "drained" in text, text
        finally:
            if client is not None:
                client.stop_ev.set()
                client.t.join(30)
            sv.proc.kill()
    finally:
        for w in ws:
            w.stop()
