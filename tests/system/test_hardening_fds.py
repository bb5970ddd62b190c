"""Out of file descriptors, the frontend pauses accepting instead of
retrying accept() at once: with more idle connections than its descriptor
limit it neither spins nor floods its log, queued clients get a 503 from
the spare descriptor, and once the idle clients leave a request is served
at once. Every process raises its soft limit to the hard one at startup.
"""
import os
import resource
import socket
import time

import gw
import sim
import util

FD_LIMIT = 256
IDLE = 700
GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}


def low_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 (1-based) of the whole line.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def soft_nofile(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no Max open files line")


def metric(g, name):
    for line in g.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def raw_status(port, timeout):
    """Sends a GET /liveness and returns (status line, seconds taken)."""
    t = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(b"GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    return data.split(b"\r\n", 1)[0], time.monotonic() - t


@util.skip_under_valgrind
def test_fd_exhaustion_pauses_accepts(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= IDLE + 100, "the test itself needs descriptors"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, IDLE + 100), hard))
    w = sim.start_simworker(tmp_path)
    try:
        exhaust_fds(tmp_path, w)
    except BaseException:
        w.proc.kill()
        raise
    w.stop()


def exhaust_fds(tmp_path, w):
    idle = []
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          "--worker-urls", w.url,
                          preexec_fn=low_fd_limit) as g:
        g.wait_ready(1)
        fe = g.pids()["frontend"][0]
        assert soft_nofile(fe) == FD_LIMIT
        lines_before = g.log().count("\n")
        try:
            for _ in range(IDLE):
                s = socket.socket()
                s.settimeout(5)
                s.connect(("127.0.0.1", g.port))
                idle.append(s)
            time.sleep(0.5)
            cpu0 = cpu_seconds(fe)
            time.sleep(3.0)
            cpu = cpu_seconds(fe) - cpu0
            # A spinning accept loop burns the whole 3 s.
            assert cpu < 0.6, f"frontend used {cpu:.2f}s CPU in 3s"
            grown = g.log().count("\n") - lines_before
            assert grown < 100, f"log grew by {grown} lines:\n" + \
                g.log()[-3000:]
            assert "pausing accepts" in g.log()
            # A new client is answered (503 from the spare descriptor)
            # within the pause, not left hanging in the queue.
            line, took = raw_status(g.port, 5)
            assert line.startswith(b"HTTP/1.1 503"), line
            assert took < 1.0 * util.TIMEOUT_MULT, took
        finally:
            for s in idle:
                s.close()
        # The idle clients gone, a request completes within a second.
        t = time.monotonic()
        r = util.post(g.port, "/generate", GEN, timeout=5)
        assert r.status == 200, r
        assert time.monotonic() - t < 1.0 * util.TIMEOUT_MULT
        assert "accepting again" in g.log()
        assert metric(g, "smg_frontend_accept_paused_total") >= 1
        assert metric(g, "smg_frontend_accept_shed_total") >= 1


def test_every_process_raises_soft_limit(tmp_path):
    def soft_low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))
    with gw.start_gateway(tmp_path, "--policy", "round_robin",
                          preexec_fn=soft_low) as g:
        pids = g.pids()
        for pid in [g.proc.pid] + [p for v in pids.values() for p in v]:
            assert soft_nofile(pid) == 4096, pid
