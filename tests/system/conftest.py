"""The system tests' process harness: no test leaves a process behind.

Every process a test starts is registered (util.py: the Popen hook and the
SMG_TEST_RUN / SMG_TEST_ID environment markers its descendants inherit).
When a test ends, whatever its outcome (pass, fail, skip, error), each
process of that test still alive is killed: SIGTERM to it and to the process
group it leads, SIGKILL after a short grace. A test that passed but left a
process running fails in its teardown (it skipped its own stop(), which
checks exit status and sanitizer logs). At the end of the run (one pytest
invocation; ctest starts one per file) any process the run started that is
still alive is killed and the run fails.
"""
import itertools
import os
import time

import pytest

import util

RUN_ID = f"{os.getpid()}-{time.time_ns()}"
os.environ[util.RUN_ENV] = RUN_ID
os.environ.pop(util.TEST_ENV, None)
util.track_subprocesses()

_test_ids = itertools.count(1)
_session_problems = []
# A process stopping on its own right as the test ends gets this long.
_SETTLE_SECS = 1.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"_smg_rep_{rep.when}", rep)


def _describe(pids):
    return "\n".join(f"  pid {p}: {util.process_name(p)}" for p in pids)


@pytest.fixture(autouse=True)
def _no_process_left(request):
    """Kills what the test left running; a passing test that left any
    fails here."""
    test = f"{next(_test_ids)}:{request.node.nodeid}"
    os.environ[util.TEST_ENV] = test
    try:
        yield
    finally:
        os.environ.pop(util.TEST_ENV, None)
        left = util.processes_of(RUN_ID, test)
        deadline = time.monotonic() + _SETTLE_SECS
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = {p for p in left if util.process_alive(p)}
        names = _describe(sorted(left))
        stuck = util.kill_processes(left) if left else []
        # One more look: a process forked while the others were killed.
        late = util.processes_of(RUN_ID, test) - set(stuck)
        if late:
            left |= late
            names += "\n" + _describe(sorted(late))
            stuck += util.kill_processes(late)
        if stuck:
            _session_problems.append(
                f"{request.node.nodeid}: could not kill:\n{_describe(stuck)}")
        rep = getattr(request.node, "_smg_rep_call", None)
        if left and rep is not None and rep.passed:
            pytest.fail(f"the test left {len(left)} processes running "
                        f"(killed now):\n{names}", pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    """Fails the run if any process it started is still alive."""
    left = sorted(util.processes_of(RUN_ID))
    problems = list(_session_problems)
    if left:
        names = _describe(left)
        stuck = util.kill_processes(set(left))
        problems.append(f"{len(left)} processes of this run still alive at "
                        f"its end (killed now{'; stuck: ' + str(stuck) if stuck else ''}):\n{names}")
    if problems:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        for p in problems:
            if tr is not None:
                tr.write_line(f"PROCESS LEAK: {p}", red=True)
            else:
                print(f"PROCESS LEAK: {p}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
