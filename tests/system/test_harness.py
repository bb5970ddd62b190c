"""The harness itself (conftest.py): a process a test leaves running is
killed at that test's end whatever its outcome, and a run whose processes
outlive it fails. Each case runs pytest on a generated test file in a
subprocess, with a copy of conftest.py, and checks the pids it wrote."""
import os
import shutil
import subprocess
import sys
import textwrap

import util

HERE = os.path.dirname(os.path.abspath(__file__))

# Each test writes the pids it started to <tmp>/pids.<name>; the process
# kinds cover Proc (own session and group), a bare Popen in the test
# runner's group, and a grandchild that leaves both (setsid, parent gone).
INNER = '''
import os
import subprocess
import sys

import pytest

import util

OUT = os.environ["HARNESS_OUT"]


def start_all(name, tmp_path):
    p = util.Proc(name, ["sleep", "300"], tmp_path)
    bare = subprocess.Popen(["sleep", "300"])
    # setsid + a parent that exits: neither a child of ours nor in any
    # group we know; only the inherited environment names it.
    sh = subprocess.run(
        ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"],
        stdout=subprocess.PIPE, check=True)
    orphan = int(sh.stdout)
    with open(os.path.join(OUT, "pids." + name), "w") as f:
        f.write(f"{p.pid} {bare.pid} {orphan}")


def test_fails(tmp_path):
    start_all("fails", tmp_path)
    assert False, "fails on purpose"


def test_skips(tmp_path):
    start_all("skips", tmp_path)
    pytest.skip("skips on purpose")


def test_raises(tmp_path):
    start_all("raises", tmp_path)
    raise RuntimeError("raises on purpose")


def test_passes_but_leaks(tmp_path):
    start_all("leaks", tmp_path)


@pytest.fixture(scope="module")
def module_proc():
    p = subprocess.Popen(["sleep", "300"])
    with open(os.path.join(OUT, "pids.module"), "w") as f:
        f.write(str(p.pid))
    yield p


def test_module_fixture_never_stopped(module_proc):
    assert module_proc.poll() is None
'''


def _run_inner(tmp_path, source):
    d = tmp_path / "inner"
    d.mkdir()
    shutil.copy(os.path.join(HERE, "conftest.py"), d / "conftest.py")
    (d / "test_inner.py").write_text(textwrap.dedent(source))
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, HARNESS_OUT=str(out),
               PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                        "no:cacheprovider", str(d)], cwd=d, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=120 * util.TIMEOUT_MULT)
    pids = {}
    for f in out.iterdir():
        pids[f.name[len("pids."):]] = [int(x) for x in f.read_text().split()]
    return r.returncode, r.stdout.decode(errors="replace"), pids


def test_harness_kills_what_tests_leave(tmp_path):
    rc, out, pids = _run_inner(tmp_path, INNER)
    try:
        assert sorted(pids) == ["fails", "leaks", "module", "raises",
                                "skips"], out
        # Every process of every outcome is gone, the setsid orphan too.
        for name, ps in pids.items():
            for p in ps:
                assert not util.process_alive(p), \
                    f"{name}: pid {p} survived the run:\n{out}"
        # Failure, skip and exception are reported as such; the passing
        # test that leaked fails in its teardown; the module fixture's
        # process, outliving every test, fails the run.
        assert "2 failed" in out and "1 skipped" in out, out
        assert "fails on purpose" in out and "raises on purpose" in out
        assert "the test left 3 processes running" in out, out
        assert "PROCESS LEAK: 1 processes of this run still alive" in out, \
            out
        assert rc == 1, out
    finally:
        util.kill_processes({p for ps in pids.values() for p in ps})


def test_harness_passes_a_clean_run(tmp_path):
    rc, out, pids = _run_inner(tmp_path, '''
        import subprocess

        import util


        def test_clean(tmp_path):
            p = util.Proc("sleeper", ["sleep", "300"], tmp_path)
            p.stop(check=False)
            subprocess.run(["true"], check=True)
        ''')
    assert rc == 0, out
    assert "PROCESS LEAK" not in out and "1 passed" in out, out
