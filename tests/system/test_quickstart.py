"""The README quick start: scripts/quickstart.sh serves real traffic and
stops cleanly on SIGINT."""
import os
import signal
import subprocess
import time

import util

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_quickstart_serves_and_stops(tmp_path):
    port, mport = util.free_port(), util.free_port()
    wports = [util.free_port(), util.free_port()]
    env = dict(os.environ, SMG_PORT=str(port), SMG_METRICS_PORT=str(mport),
               SMG_WORKER_PORTS=" ".join(map(str, wports)),
               SMG_BUILD_DIR=os.path.abspath(util.BUILD_DIR),
               TMPDIR=str(tmp_path))
    log = open(tmp_path / "quickstart.log", "wb")
    p = subprocess.Popen([os.path.join(ROOT, "scripts", "quickstart.sh")],
                         env=env, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        def ready():
            r = util.get(port, "/readiness")
            return r.status == 200 and r.json()["healthy_workers"] == 2
        util.wait_for(ready, timeout=60, what="quickstart readiness")
        # cache_aware (the default): a conversation stays on the worker
        # that holds its prefix.
        seen = set()
        prompt = "You are a helpful assistant. " * 40
        for i in range(4):
            r = util.post(port, "/v1/chat/completions", {
                "model": "sim-model",
                "messages": [{"role": "system", "content": prompt},
                             {"role": "user", "content": f"question {i}"}]})
            assert r.status == 200, r
            assert r.json()["choices"][0]["message"]["content"]
            seen.add(r.headers["x-smg-routed-worker-id"])
        assert len(seen) == 1
        assert b"smg_" in util.get(mport, "/metrics").body
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(timeout=10 * util.TIMEOUT_MULT) == 0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
    # Nothing left behind: no quickstart temp dir, no process of the group.
    time.sleep(0.2)
    leftovers = [d for d in os.listdir(tmp_path) if d.startswith("smg-quickstart")]
    assert leftovers == []
    def group_gone():
        return subprocess.run(["pgrep", "-g", str(p.pid)],
                              capture_output=True).returncode == 1
    try:
        util.wait_for(group_gone, timeout=5, what="quickstart processes gone")
    except TimeoutError:
        left = subprocess.run(["pgrep", "-a", "-g", str(p.pid)],
                              capture_output=True, text=True).stdout
        raise AssertionError(f"left running: {left}")
