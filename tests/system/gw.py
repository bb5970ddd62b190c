"""Gateway harness: runs build/smg (launcher, broker, poller, frontends).

start_gateway(tmp_path, *args, frontends=1, env=None) starts smg on free
loopback ports with its run and state dirs under tmp_path and returns once
GET /liveness answers. Gateway.stop() is the shutdown contract: SIGTERM,
everything gone within 5 s, no socket or shm file left, exit 0, and no
sanitizer report in the log (all processes share the launcher's stderr).
With SMG_VALGRIND=1 (see util.py) every process runs under valgrind, and
stop() also asserts that each one alive at the SIGTERM wrote a complete,
clean valgrind report (the launcher is given SMG_STOP_SECS to wait for them).
Use it as a context manager to SIGKILL everything if a test fails midway.
"""
import os
import signal
import stat
import time

import util

ROLES = {"smg-broker": "broker", "smg-poller": "poller",
         "smg-frontend": "frontend"}
STOP_SECS = 5.0


def _ppid_and_exe(pid):
    """(ppid, exe basename) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat_line = f.read()
        exe = os.readlink(f"/proc/{pid}/exe")
        if util.VALGRIND and "valgrind" in exe:
            # Under valgrind the exe is the tool: name the program it runs.
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            exe = util.exe_of_cmdline(argv)
        exe = os.path.basename(exe)
    except OSError:
        return None
    # The command name may hold spaces or parens: split after the last ')'.
    fields = stat_line[stat_line.rfind(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), exe


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            line = f.read()
    except OSError:
        return False
    return line[line.rfind(")") + 2:].split()[0] != "Z"


def processes_mentioning(text):
    """Pids whose command line contains text (e.g. a test's tmp dir)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if text in cmd and pid_alive(int(name)):
            found.append(int(name))
    return found


def sockets_in(path):
    if not os.path.isdir(path):
        return []
    return [n for n in os.listdir(path)
            if stat.S_ISSOCK(os.lstat(os.path.join(path, n)).st_mode)]


class Gateway:
    def __init__(self, tmp_path, args, frontends=1, env=None, command=None,
                 preexec_fn=None, prefix=None):
        self.tmp_path = tmp_path
        self.port = util.free_port()
        self.metrics_port = util.free_port()
        self.run_dir = str(tmp_path / "run")
        self.state_dir = str(tmp_path / "state")
        self.frontends = frontends
        argv = list(prefix or []) + [util.binary("smg")]
        if command:
            argv.append(command)
        argv += ["--host", "127.0.0.1", "--port", str(self.port),
                 "--prometheus-host", "127.0.0.1",
                 "--prometheus-port", str(self.metrics_port),
                 "--run-dir", self.run_dir, "--state-dir", self.state_dir,
                 "--frontends", str(frontends)]
        argv += [str(a) for a in args]
        self.argv = argv
        self.proc = util.Proc("smg", argv, tmp_path, env=env,
                              preexec_fn=preexec_fn)
        self.stopped = False

    # -- HTTP
    def get(self, path, **kw):
        return util.get(self.port, path, **kw)

    def post(self, path, body=None, **kw):
        return util.post(self.port, path, body=body, **kw)

    def request(self, method, path, **kw):
        return util.request(self.port, method, path, **kw)

    def metrics(self):
        return util.get(self.metrics_port, "/metrics").body.decode()

    def log(self):
        return self.proc.log()

    # -- processes
    def pids(self):
        """Children of the launcher by role: {"broker": [..], ...}."""
        out = {"broker": [], "poller": [], "frontend": []}
        me = self.proc.pid
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            info = _ppid_and_exe(int(name))
            if info is None or info[0] != me:
                continue
            role = ROLES.get(info[1])
            if role:  # a just-forked child is still "smg" until exec
                out[role].append(int(name))
        for v in out.values():
            v.sort()
        return out

    def all_started(self):
        p = self.pids()
        # With --broker the broker and the poller are another host's.
        backend = 0 if "--broker" in self.argv else 1
        return (len(p["broker"]) == backend and
                len(p["poller"]) == backend and
                len(p["frontend"]) == self.frontends)

    def wait_live(self, timeout=15.0):
        def live():
            if not self.proc.alive():
                raise AssertionError(
                    f"smg exited {self.proc.p.returncode}:\n"
                    f"{self.log()[-3000:]}")
            return self.get("/liveness", timeout=2).status == 200
        util.wait_for(live, timeout=timeout, what="gateway /liveness")
        util.wait_for(self.all_started, timeout=timeout,
                      what="all gateway processes")

    def wait_ready(self, n_workers, timeout=20.0):
        """Waits until at least n_workers workers are Ready."""
        def ready():
            r = self.get("/readiness", timeout=2)
            if r.status == 200 and \
                    r.json().get("healthy_workers", 0) >= n_workers:
                return r.json()
            r = self.get("/workers", timeout=2)
            if r.status == 200:
                ws = r.json().get("workers", [])
                if sum(1 for w in ws if w.get("status") == "Ready") \
                        >= n_workers:
                    return r.json()
            return None
        return util.wait_for(ready, timeout=timeout,
                             what=f"{n_workers} Ready workers")

    # -- shutdown
    def stop(self):
        """SIGTERM; asserts the whole group and its files are gone."""
        if self.stopped:
            return
        children = [p for v in self.pids().values() for p in v]
        start = time.monotonic()
        self.stopped = True
        self.proc.stop(signal.SIGTERM, timeout=STOP_SECS)
        took = time.monotonic() - start
        assert took < STOP_SECS * util.TIMEOUT_MULT, f"stop took {took:.1f}s"
        left = [p for p in children if pid_alive(p)]
        assert not left, f"processes left after stop: {left}"
        assert not sockets_in(self.run_dir), \
            f"sockets left: {sockets_in(self.run_dir)}"
        assert not os.path.exists(os.path.join(self.run_dir, "smg.shm")), \
            "shm segment left"
        if util.VALGRIND:
            # Every process alive at the SIGTERM exited on its own, so
            # each one's leaks were checked (Proc.stop read the reports).
            # A child still starting up dies of the SIGTERM itself, before
            # it has anything to leak.
            log = self.log()
            assert "ignored SIGTERM" not in log, log[-3000:]
            for pid in [self.proc.pid] + children:
                if f"pid {pid} killed by signal {int(signal.SIGTERM)} " \
                        in log:
                    continue
                path = f"{self.proc.vg_prefix}.{pid}.log"
                assert os.path.exists(path) and \
                    util.valgrind_complete(path), \
                    f"{path}: no valgrind summary (killed?)\n{log[-3000:]}"

    def kill(self):
        """SIGKILL the launcher and every child; no checks."""
        if self.stopped:
            return
        self.stopped = True
        pids = [p for v in self.pids().values() for p in v]
        self.proc.kill()
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc._log.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.stop()
        else:
            self.kill()
        return False


def start_gateway(tmp_path, *args, frontends=1, env=None, command=None,
                  preexec_fn=None, prefix=None):
    """Starts smg with args; returns once /liveness answers. preexec_fn
    runs in the child before exec (resource limits); prefix is a command
    the launcher runs under (setpriv)."""
    gw = Gateway(tmp_path, args, frontends=frontends, env=env,
                 command=command, preexec_fn=preexec_fn, prefix=prefix)
    try:
        gw.wait_live()
    except BaseException:
        gw.kill()
        raise
    return gw
