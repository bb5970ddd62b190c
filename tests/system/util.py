"""Helpers shared by the system tests: ports, processes, HTTP on loopback.

Every test gets its own temp dir (pytest's tmp_path) and ports picked by
binding port 0, so tests run side by side. Processes are started with their
output captured to files in the temp dir; stop() fails the test when a
process exited badly or when AddressSanitizer/UBSan reported anything.
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import time

BUILD_DIR = os.environ.get(
    "SMG_BUILD_DIR",
    os.path.join(os.path.dirname(__file__), "..", "..", "build"))
TIMEOUT_MULT = float(os.environ.get("TEST_TIMEOUT_MULT", "1"))
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
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


class Proc:
    """A started binary whose stdout/stderr go to <tmp>/<name>.log."""

    def __init__(self, name, argv, tmp_path, env=None):
        self.name = name
        self.argv = argv
        self.log_path = os.path.join(str(tmp_path), f"{name}.log")
        self._log = open(self.log_path, "ab")
        full_env = dict(os.environ)
        full_env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        if env:
            full_env.update(env)
        self.p = subprocess.Popen(argv, stdout=self._log,
                                  stderr=subprocess.STDOUT, env=full_env,
                                  start_new_session=True)

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
