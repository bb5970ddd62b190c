"""Helpers shared by the system tests: ports, processes, HTTP on loopback.

Every test gets its own temp dir (pytest's tmp_path) and ports picked by
binding port 0, so tests run side by side. Processes are started with their
output captured to files in the temp dir; stop() fails the test when a
process exited badly or when AddressSanitizer/UBSan reported anything.

With SMG_VALGRIND=1 in the environment (and a build configured with
-DSANITIZER=), every Proc runs under valgrind's memcheck, children the
launcher execs included; each process writes <tmp>/vg.<name>.<pid>.log and
stop() fails the test when one of them reports an error or a definite or
indirect leak. Timeouts are stretched (TEST_TIMEOUT_MULT, 10 unless set).

Every process a test starts, through Proc or any other subprocess.Popen
(subprocess.run included), is registered here with the test that started it
and the environment markers RUN_ENV/TEST_ENV, which its descendants inherit
(see conftest.py: the harness kills what a test leaves behind).
"""
import glob
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

BUILD_DIR = os.environ.get(
    "SMG_BUILD_DIR",
    os.path.join(os.path.dirname(__file__), "..", "..", "build"))
VALGRIND = os.environ.get("SMG_VALGRIND", "") not in ("", "0")
TIMEOUT_MULT = float(os.environ.get("TEST_TIMEOUT_MULT",
                                    "10" if VALGRIND else "1"))
# For a test that measures time and cannot fit valgrind's slowdown; it
# still runs in every other mode.
skip_under_valgrind = pytest.mark.skipif(
    VALGRIND, reason="timing-sensitive; does not fit valgrind's slowdown")
VALGRIND_SUPP = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             "valgrind.supp")
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                   "WARNING: ThreadSanitizer",
                   "runtime error:")


def binary(name):
    path = os.path.join(BUILD_DIR, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not built")
    return path


def free_port():
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout=10.0, interval=0.05, what="condition"):
    """Polls pred() until it returns a truthy value; returns that value."""
    deadline = time.monotonic() + timeout * TIMEOUT_MULT
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except (OSError, http.client.HTTPException, ValueError) as e:
            last_exc = e
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what} (last error: {last_exc})")


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # dict, lowercase names
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<Response {self.status} {self.body[:200]!r}>"


def request(port, method, path, body=None, headers=None, timeout=10.0,
            host="127.0.0.1"):
    """One HTTP/1.1 request on a fresh connection; returns a Response."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout * TIMEOUT_MULT)
    try:
        hdrs = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()},
                        data)
    finally:
        conn.close()


def get(port, path, **kw):
    return request(port, "GET", path, **kw)


def post(port, path, body=None, **kw):
    return request(port, "POST", path, body=body, **kw)


def valgrind_argv(log_prefix):
    """The memcheck command line that prefixes a binary's argv."""
    argv = ["valgrind", "--leak-check=full",
            "--show-leak-kinds=definite,indirect",
            "--errors-for-leak-kinds=definite,indirect",
            "--error-exitcode=99", "--trace-children=yes",
            "--child-silent-after-fork=yes", "--num-callers=30",
            f"--log-file={log_prefix}.%p.log"]
    if os.path.exists(VALGRIND_SUPP):
        argv.append(f"--suppressions={VALGRIND_SUPP}")
    return argv


def exe_of_cmdline(argv):
    """The program a /proc cmdline runs: past valgrind's own options when
    the process runs under valgrind, argv[0] otherwise."""
    if not argv:
        return ""
    if os.path.basename(argv[0]).startswith("valgrind"):
        for a in argv[1:]:
            if not a.startswith("-"):
                return a
        return ""
    return argv[0]


_VG_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors")
_VG_LOST = re.compile(r"(definitely|indirectly) lost: ([\d,]+) bytes")
_VG_STACK = re.compile(r"^==\d+==\s+(at|by) 0x", re.M)


def valgrind_complete(path):
    """Whether a valgrind log holds the end-of-run summary (a process
    killed by SIGKILL writes none, so its leaks went unchecked)."""
    with open(path, "rb") as f:
        return _VG_SUMMARY.search(f.read().decode(errors="replace")) \
            is not None


def valgrind_problems(path):
    """A non-empty excerpt when a valgrind log reports errors or leaks."""
    with open(path, "rb") as f:
        text = f.read().decode(errors="replace")
    bad = any(int(n) for n in _VG_SUMMARY.findall(text))
    bad = bad or any(int(n.replace(",", "")) for _, n in
                     _VG_LOST.findall(text))
    # A process killed by SIGKILL writes no summary: its errors still
    # show as stacks.
    bad = bad or (not _VG_SUMMARY.search(text) and _VG_STACK.search(text))
    return text[-12000:] if bad else ""


class Proc:
    """A started binary whose stdout/stderr go to <tmp>/<name>.log."""

    def __init__(self, name, argv, tmp_path, env=None, preexec_fn=None):
        self.name = name
        self.argv = argv
        self.log_path = os.path.join(str(tmp_path), f"{name}.log")
        self.vg_prefix = os.path.join(str(tmp_path), f"vg.{name}")
        if VALGRIND:
            argv = valgrind_argv(self.vg_prefix) + list(argv)
        self._log = open(self.log_path, "ab")
        full_env = dict(os.environ)
        full_env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        if VALGRIND:
            # The launcher's SIGTERM-to-SIGKILL delay: memcheck's leak
            # scan at exit takes seconds, and a killed child reports none.
            full_env.setdefault("SMG_STOP_SECS", str(4 * TIMEOUT_MULT))
        if env:
            full_env.update(env)
        self.p = subprocess.Popen(argv, stdout=self._log,
                                  stderr=subprocess.STDOUT, env=full_env,
                                  start_new_session=True,
                                  preexec_fn=preexec_fn)

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def send_signal(self, sig):
        if self.alive():
            self.p.send_signal(sig)

    def wait(self, timeout=10.0):
        return self.p.wait(timeout=timeout * TIMEOUT_MULT)

    def stop(self, sig=signal.SIGTERM, timeout=10.0, check=True):
        """Stops the process; with check, asserts a clean exit and log."""
        if self.alive():
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout=timeout * TIMEOUT_MULT)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                if check:
                    raise AssertionError(f"{self.name} ignored {sig!r}")
        self._log.close()
        if check:
            self.check_log()
            assert self.p.returncode == 0, \
                f"{self.name} exited {self.p.returncode}:\n{self.log()[-3000:]}"

    def kill(self):
        if self.alive():
            self.p.kill()
            self.p.wait()

    def check_log(self):
        text = self.log()
        for mark in SANITIZER_MARKS:
            assert mark not in text, f"{self.name}: {mark}\n{text[-5000:]}"
        if VALGRIND:
            self.check_valgrind()

    def valgrind_logs(self):
        return sorted(glob.glob(glob.escape(self.vg_prefix) + ".*.log"))

    def check_valgrind(self):
        """Asserts that no valgrind log of this process (or of a child it
        exec'd) reports an error or a definite/indirect leak."""
        for path in self.valgrind_logs():
            excerpt = valgrind_problems(path)
            assert not excerpt, \
                f"{self.name}: valgrind reports in {path}:\n{excerpt}"


# -- Process registry ---------------------------------------------------------
#
# conftest.py sets os.environ[RUN_ENV] once per pytest run and
# os.environ[TEST_ENV] for the length of each test, so every process started
# from Python, and every descendant that keeps its environment (the
# launcher's children, a double fork), carries both. Popen is replaced by a
# subclass that records each process it starts; a process started in a new
# session (start_new_session=True, as Proc does) leads its own process group,
# which is signalled whole.

RUN_ENV = "SMG_TEST_RUN"
TEST_ENV = "SMG_TEST_ID"
_registry = []          # [_Started]
_registry_lock = threading.Lock()
_OrigPopen = subprocess.Popen


class _Started:
    def __init__(self, popen, test, leads_group):
        self.popen = popen
        self.pid = popen.pid
        self.test = test                # TEST_ENV value, or None
        self.leads_group = leads_group


class TrackedPopen(_OrigPopen):
    """subprocess.Popen that registers what it starts."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        leads = bool(kw.get("start_new_session")) or \
            kw.get("process_group") == 0
        with _registry_lock:
            _registry.append(_Started(self, os.environ.get(TEST_ENV), leads))


def track_subprocesses():
    """Routes every later subprocess.Popen (and run/call/check_output,
    which use it) through TrackedPopen."""
    subprocess.Popen = TrackedPopen


def _proc_stat(pid):
    """(state, pgid) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            line = f.read()
    except OSError:
        return None
    fields = line[line.rfind(")") + 2:].split()
    return fields[0], int(fields[2])


def process_alive(pid):
    """Whether pid names a running process (a zombie is not)."""
    st = _proc_stat(pid)
    return st is not None and st[0] != "Z"


_PF_KTHREAD = 0x00200000


def _environ_of(pid):
    """A process's environment at its last exec; None if it is gone. A
    process in the middle of an exec shows an empty one for a moment, so
    an empty one is read again (kernel threads have none at all)."""
    for _ in range(50):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read()
            with open(f"/proc/{pid}/stat") as f:
                line = f.read()
        except OSError:
            return None
        flags = int(line[line.rfind(")") + 2:].split()[6])
        if raw or flags & _PF_KTHREAD:
            break
        time.sleep(0.01)
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def process_name(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
        return " ".join(a for a in argv if a)[:200]
    except OSError:
        return "?"


def processes_of(run, test=None):
    """Live pids whose environment carries RUN_ENV=run (and TEST_ENV=test
    unless test is None), plus the live registered ones of that run's test;
    never this process."""
    me = os.getpid()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        env = _environ_of(int(name))
        if env is None or env.get(RUN_ENV) != run:
            continue
        if test is not None and env.get(TEST_ENV) != test:
            continue
        if process_alive(int(name)):
            found.add(int(name))
    with _registry_lock:
        for s in _registry:
            if (test is None or s.test == test) and s.pid != me and \
                    s.popen.poll() is None:
                found.add(s.pid)
    return found


def _signal_all(pids, groups, sig):
    for g in groups:
        try:
            os.killpg(g, sig)
        except OSError:
            pass
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


def _reap_registered():
    with _registry_lock:
        for s in _registry:
            try:
                s.popen.poll()
            except OSError:
                pass


def kill_processes(pids, grace=3.0):
    """SIGTERM to every pid and to the process group each of them leads
    (never this process's own group), SIGKILL to what is left after grace
    seconds; waits until all are gone. Returns the pids still alive at the
    end (none unless a process is stuck in the kernel)."""
    mine = os.getpgrp()
    groups = set()
    for p in pids:
        st = _proc_stat(p)
        if st is not None and st[1] == p and p != mine:
            groups.add(p)
    with _registry_lock:
        for s in _registry:
            if s.pid in pids and s.leads_group and s.pid != mine:
                groups.add(s.pid)

    def members():
        """Live pids in the groups (new forks included) and the list."""
        live = {p for p in pids if process_alive(p)}
        if groups:
            for name in os.listdir("/proc"):
                if name.isdigit():
                    st = _proc_stat(int(name))
                    if st and st[0] != "Z" and st[1] in groups:
                        live.add(int(name))
        return live

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        live = members()
        if not live:
            return []
        _signal_all(live, groups, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap_registered()
            if not members():
                return []
            time.sleep(0.05)
    _reap_registered()
    return sorted(members())
