"""ctest's first and last step around a run: no smg process outlives it.

  leftover_check.py start STAMP        records when the run starts
  leftover_check.py check STAMP BUILD  fails (and kills them) if any process
                                       running a program from BUILD whose
                                       name starts with "smg" (smg, smg-*,
                                       smg-simworker) started since STAMP
                                       is still alive

ctest runs "start" as the setup and "check" as the cleanup of the fixture
every test requires, so "check" runs after all of them, with -j too.
"""
import os
import signal
import sys
import time


def _stat(pid):
    """(state, starttime in clock ticks since boot), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            line = f.read()
    except OSError:
        return None
    fields = line[line.rfind(")") + 2:].split()
    return fields[0], int(fields[19])


def _program(pid):
    """The program a process runs: its exe, or under valgrind the first
    non-option argument."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a for a in f.read().decode(errors="replace")
                    .split("\0") if a]
    except OSError:
        return None, ""
    if exe.endswith(" (deleted)"):
        exe = exe[:-len(" (deleted)")]
    if os.path.basename(exe).startswith("valgrind"):
        exe = next((a for a in argv[1:] if not a.startswith("-")), exe)
    return exe, " ".join(argv)[:200]


def start(stamp):
    st = _stat(os.getpid())
    with open(stamp, "w") as f:
        f.write(str(st[1]))
    return 0


def check(stamp, build):
    with open(stamp) as f:
        since = int(f.read())
    build = os.path.realpath(build)
    left = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        st = _stat(pid)
        if st is None or st[0] == "Z" or st[1] < since:
            continue
        exe, cmd = _program(pid)
        if exe is None or not os.path.basename(exe).startswith("smg"):
            continue
        if os.path.dirname(os.path.realpath(exe)) != build:
            continue
        left.append((pid, cmd))
    if not left:
        print("no smg process left running")
        return 0
    print(f"{len(left)} smg processes started by this run are still "
          "running (killing them):")
    for pid, cmd in left:
        print(f"  pid {pid}: {cmd}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.5)
    return 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "start":
        sys.exit(start(sys.argv[2]))
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    sys.exit(__doc__)
