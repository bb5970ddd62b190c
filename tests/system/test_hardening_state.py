"""An unusable LMDB state dir (truncated data.mdb, garbage, an unreadable
file, the state dir a file) never keeps the broker from starting: it moves
the bad files aside, logs one error line, starts on empty state plus the
command line within 2 s, and requests to the command-line worker succeed.
"""
import glob
import os
import time

import pytest

import gw
import sim
import util

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}


def fill_state(tmp_path, w):
    """Runs a cache_aware gateway long enough to grow data.mdb."""
    with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                          "--worker-urls", w.url) as g:
        g.wait_ready(1)
        for i in range(40):
            body = {"text": f"{i:04d} " + "prompt words " * 400,
                    "sampling_params": {"max_new_tokens": 1}}
            assert g.post("/generate", body).status == 200
        time.sleep(0.5)  # past the write-behind bound
        return g.state_dir


def truncate(state):
    path = os.path.join(state, "data.mdb")
    assert os.path.getsize(path) > 24576
    os.truncate(path, 24576)


def garbage(state):
    path = os.path.join(state, "data.mdb")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(os.urandom(size))


def unreadable(state):
    os.chmod(os.path.join(state, "data.mdb"), 0)


def state_is_file(state):
    for name in os.listdir(state):
        os.unlink(os.path.join(state, name))
    os.rmdir(state)
    with open(state, "w") as f:
        f.write("not a directory\n")


# Root reads a mode-000 file anyway: drop the capabilities that let it.
NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


@util.skip_under_valgrind
@pytest.mark.parametrize("damage", [truncate, garbage, unreadable,
                                    state_is_file],
                         ids=["truncated", "garbage", "unreadable",
                              "state_dir_file"])
def test_damaged_state_starts_empty(tmp_path, damage):
    w = sim.start_simworker(tmp_path)
    try:
        damaged_restart(tmp_path, w, damage)
    except BaseException:
        w.proc.kill()
        raise
    w.stop()


def damaged_restart(tmp_path, w, damage):
    state = fill_state(tmp_path, w)
    damage(state)
    prefix = NO_DAC if damage is unreadable and os.geteuid() == 0 else None
    before = len(open(tmp_path / "smg.log", "rb").read())
    t0 = time.monotonic()
    g = gw.Gateway(tmp_path, ["--policy", "cache_aware",
                              "--worker-urls", w.url], prefix=prefix)
    try:
        def served():
            r = g.post("/generate", GEN, timeout=2)
            return r.status == 200
        util.wait_for(served, timeout=10, interval=0.05,
                      what="a request served after the restart")
        took = time.monotonic() - t0
        assert took < 2.0 * util.TIMEOUT_MULT, f"took {took:.2f}s"
        broker = g.pids()["broker"]
        time.sleep(1.0)
        assert g.pids()["broker"] == broker, "broker restarted"
        r = g.get("/workers")
        assert r.status == 200 and len(r.json()["workers"]) == 1, r
        log = open(tmp_path / "smg.log", "rb").read()[before:].decode(
            errors="replace")
        assert log.count("unusable state") == 1, log[-3000:]
        assert "starting from empty state" in log, log[-3000:]
        assert "killed by signal" not in log and \
            "exited" not in log, log[-3000:]
        moved = glob.glob(glob.escape(state) + "*corrupt-*") + \
            glob.glob(os.path.join(glob.escape(state), "*.corrupt-*"))
        assert moved, os.listdir(os.path.dirname(state))
        assert os.path.isdir(state)
        g.stop()
    except BaseException:
        g.kill()
        raise
