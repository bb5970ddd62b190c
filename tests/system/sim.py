"""Starting smg-simworker, the simulated LLM engine, from system tests.

    w = start_simworker(tmp_path, "--engine", "vllm")
    util.post(w.port, "/v1/completions", {"prompt": "hi"})
    w.control(fail_rate=1.0)      # POST /sim/control
    w.stats()["requests"]         # GET /sim/stats
    w.stop()                      # SIGTERM; asserts exit 0, no sanitizer report
"""
import itertools

import util

_names = itertools.count()


class SimWorker:
    def __init__(self, name, proc, port):
        self.name = name
        self.proc = proc          # util.Proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def stats(self):
        r = util.get(self.port, "/sim/stats")
        assert r.status == 200, r
        return r.json()

    def reset_stats(self):
        r = util.post(self.port, "/sim/reset_stats", {})
        assert r.status == 200, r

    def control(self, **kw):
        """Sets any of healthy, fail_rate, hang_rate, close_rate, status."""
        r = util.post(self.port, "/sim/control", kw)
        assert r.status == 200, r
        return r.json()

    def stop(self, **kw):
        self.proc.stop(**kw)


def _read_port(path, proc):
    if not proc.alive():
        raise RuntimeError(f"{proc.name} exited {proc.p.returncode}:\n"
                           f"{proc.log()[-2000:]}")
    if not path.exists():
        return None
    text = path.read_text().strip()
    return int(text) if text else None


def start_simworker(tmp_path, *extra_args, name=None, wait_healthy=True):
    """Starts smg-simworker on a free port (--port 0 + --port-file) and
    waits until it serves (/health answers 200 unless wait_healthy is
    False, e.g. with --start-delay). extra_args are more flags."""
    name = name or f"simworker{next(_names)}"
    port_file = tmp_path / f"{name}.port"
    argv = [util.binary("smg-simworker"), "--port", "0",
            "--port-file", str(port_file), *map(str, extra_args)]
    proc = util.Proc(name, argv, tmp_path)
    try:
        port = util.wait_for(lambda: _read_port(port_file, proc),
                             what=f"{name} port file")
        if wait_healthy:
            util.wait_for(
                lambda: util.get(port, "/health", timeout=2).status == 200,
                what=f"{name} /health")
    except BaseException:
        proc.kill()
        raise
    return SimWorker(name, proc, port)
