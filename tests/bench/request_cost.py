#!/usr/bin/python3
"""request_cost.py: CPU per request of smg-c's request path, by stage.

One gateway (`smg --frontends 1 --policy round_robin`, two smg-simworkers
at --time-scale 0), three passes over the same load (wrk, --conns
connections, the ~1 KB completion and the 64-chunk stream bodies of
datapath.py):

  1. plain: the Release binaries as they are; utime and stime of the
     frontend and the broker (/proc/PID/stat) over --secs seconds give
     user and system CPU per request (requests counted by the workers'
     /sim/stats, so exact); --rounds passes, each on a fresh gateway,
     medians reported; with --compare-build, that build's passes
     alternate with these and the report compares them;
  2. strace -c on the frontend and the broker for --strace-secs: syscalls
     per request, by name;
  3. callgrind: `valgrind --tool=callgrind --trace-children=yes smg ...`;
     after a warm-up every callgrind process is zeroed
     (callgrind_control -z PID), the load runs, the counters are dumped
     (callgrind_control -d PID); callgrind_annotate gives the self
     instructions (Ir) of every function, which are grouped into stages
     by source file and function name (STAGES below).

The cost table spreads each process's user CPU per request (pass 1) over
its stages in proportion to their instructions (pass 3): an approximation
that assumes every stage retires instructions at the same speed. System
CPU per request is its own row, with the syscalls per request of pass 2.

Prints a Markdown report (also written to --out). Every process started
is stopped on exit. Standard library only, plus valgrind and strace.

usage: /usr/bin/python3 tests/bench/request_cost.py [--build-dir DIR]
       [--out F]
"""
import argparse
import glob
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import (Interrupted, Procs, add_build_dir, add_out, build_type,
                      finish, free_port, logger, machine, md_table, smg_ready,
                      start_simworker, trap_signals, wait_for)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import datapath  # noqa: E402  (bodies and the wrk driver)

MODEL = datapath.MODEL
WORKLOADS = datapath.WORKLOADS
log = logger()

# Stage of a function: the first rule whose file regex matches the source
# file (or object, for libraries without one) and whose function regex
# matches the function name. Frontend and broker rules differ.
FRONTEND_STAGES = (
    ("connection, HTTP parsing (requests and upstream responses)",
     r"frontend/(conn|listener)\.c$", r"^(?!conn_(write|flush|relay|out|"
     r"respond|response|json|error|unqueue|linger))"),
    ("relay and write to the client", r"frontend/conn\.c$", r""),
    ("relay and write to the client", r"shared/http\.c$", r"^http_out|"
     r"out_reserve|http_status_reason|http_error_body"),
    ("connection, HTTP parsing (requests and upstream responses)",
     r"shared/http\.c$|http_parser|libhttp", r""),
    ("body JSON extraction", r"frontend/extract\.c$|libcjson", r""),
    ("broker conversation (decide, SP, protobuf)",
     r"frontend/(decide|fallback)\.c$|shared/(sp|ipc)\.c$|protobuf|"
     r"ipc\.pb-c\.c$", r""),
    ("exchange and proxy", r"frontend/(exchange|proxy|router|retry|"
     r"admission|endpoints)\.c$", r""),
    ("upstream client", r"frontend/upstream\.c$", r""),
    ("header building", r"frontend/hdr\.c$", r""),
    ("metrics and shared memory", r"frontend/stats\.c$|shared/(metrics|"
     r"shm|arena|log)\.c$", r""),
    ("event loop (libev)", r"libev|/ev\.c$|ev_epoll", r""),
    ("libc (malloc, memcpy, string, syscall stubs)", r"libc|ld-linux|"
     r"vdso|libm\b|libpthread|^\./", r""),
)
BROKER_STAGES = (
    ("SP transport and IPC dispatch", r"shared/(sp|ipc)\.c$", r""),
    ("protobuf pack and unpack", r"protobuf|ipc\.pb-c\.c$", r""),
    ("routing (policy, registry, live load, breaker)", r"broker/", r""),
    ("event loop (libev)", r"libev|/ev\.c$", r""),
    ("libc (malloc, memcpy, string, syscall stubs)", r"libc|ld-linux|"
     r"vdso|libm\b|libpthread|^\./", r""),
    ("metrics and shared memory", r"shared/(metrics|shm|log)\.c$", r""),
)
OTHER = "other"


def parse_args():
    ap = argparse.ArgumentParser(
        description="smg-c CPU per request by stage (callgrind, "
                    "/proc/PID/stat, strace)")
    add_build_dir(ap, "Release build holding smg, smg-frontend, "
                      "smg-broker and smg-simworker")
    add_out(ap)
    ap.add_argument("--conns", type=int, default=16,
                    help="wrk connections (load)")
    ap.add_argument("--threads", type=int, default=2, help="wrk threads")
    ap.add_argument("--secs", type=int, default=8,
                    help="plain pass: seconds of load per workload")
    ap.add_argument("--strace-secs", type=int, default=4)
    ap.add_argument("--cg-secs", type=int, default=20,
                    help="callgrind pass: seconds of load per workload")
    ap.add_argument("--prompt-bytes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3,
                    help="plain passes (medians are reported)")
    ap.add_argument("--compare-build", default=None,
                    help="another Release build dir: its plain passes "
                         "alternate with ours, and the report compares")
    ap.add_argument("--skip-callgrind", action="store_true")
    ap.add_argument("--keep-tmp", action="store_true")
    args = ap.parse_args()
    args.argv = ["/usr/bin/python3", os.path.relpath(__file__, ROOT)] + \
        sys.argv[1:]
    args.build_dir = os.path.abspath(args.build_dir)
    args.build_type = build_type(args.build_dir)
    if args.compare_build:
        args.compare_build = os.path.abspath(args.compare_build)
    args.cores = 1  # for datapath.wrk
    return args


def children(pid):
    """{comm: [pid, ...]} of pid's child processes."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        if ppid == pid:
            out.setdefault(comm, []).append(int(d))
    return out


def cpu_ticks(pid):
    """(utime, stime) of pid in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        st = f.read()
    fields = st[st.rindex(")") + 2:].split()
    return int(fields[11]), int(fields[12])


def role_pids(launcher_pid, timeout=10.0):
    """{"frontend": pid, "broker": pid} of an smg launcher's children."""
    roles = {}

    def found():
        ch = children(launcher_pid)
        for comm, pids in ch.items():
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().split(b"\0")
                except OSError:
                    continue
                exe = " ".join(c.decode(errors="replace") for c in cmd[:8])
                for role in ("frontend", "broker"):
                    if f"smg-{role}" in exe:
                        roles[role] = pid
        return len(roles) == 2
    wait_for(found, timeout, "smg children")
    return roles


def start_gateway(procs, args, workers, name, wrapper=(), build_dir=None):
    """smg of build_dir (default --build-dir; under wrapper, if any) on a
    free port; (proc, port)."""
    urls = [f"http://127.0.0.1:{w}" for w in workers]
    port, prom = free_port(), free_port()
    argv = list(wrapper) + [
        os.path.join(build_dir or args.build_dir, "smg"), "--port",
        str(port),
        "--prometheus-port", str(prom),
        "--run-dir", os.path.join(procs.tmp, f"run-{name}"),
        "--state-dir", os.path.join(procs.tmp, f"state-{name}"),
        "--policy", "round_robin", "--frontends", "1",
        "--worker-urls", *urls, "--log-level", "warn"]
    p = procs.start(name, argv)
    wait_for(lambda: smg_ready(port, 2)[0], 120.0 if wrapper else 30.0,
             f"{name} ready", p)
    return p, port


def load(procs, args, port, body_file, secs, workers):
    """wrk for secs; (wrk result, requests the workers completed)."""
    before = datapath.worker_requests(workers)
    r = datapath.wrk(procs, args,
                     f"http://127.0.0.1:{port}/v1/completions", body_file,
                     args.conns, secs)
    time.sleep(0.5)
    after = datapath.worker_requests(workers)
    n = sum(after) - sum(before) if before and after else 0
    return r, n


def cpu_pass(procs, args, workers, bodies, build_dir, name):
    """One gateway of build_dir under each workload's load for --secs:
    {workload: {"requests", "rps", "errors", role: (user µs, system µs)
    per request}}."""
    p, port = start_gateway(procs, args, workers, name, build_dir=build_dir)
    pids = role_pids(p.pid)
    tck = os.sysconf("SC_CLK_TCK")
    res = {}
    for w in WORKLOADS:
        load(procs, args, port, bodies[w][0], 2, workers)  # warm-up
        t0 = {r: cpu_ticks(pid) for r, pid in pids.items()}
        r, n = load(procs, args, port, bodies[w][0], args.secs, workers)
        t1 = {r: cpu_ticks(pid) for r, pid in pids.items()}
        e = {"requests": n, "rps": r.get("rps", 0.0),
             "errors": r.get("errors_total", "failed")}
        for role in pids:
            u = (t1[role][0] - t0[role][0]) / tck
            s = (t1[role][1] - t0[role][1]) / tck
            e[role] = (u * 1e6 / max(n, 1), s * 1e6 / max(n, 1))
        log(f"{name} {w}: {n} requests, {e['rps']:.0f} req/s, frontend "
            f"user/sys {e['frontend'][0]:.1f}/{e['frontend'][1]:.1f} µs, "
            f"broker {e['broker'][0]:.1f}/{e['broker'][1]:.1f} µs")
        res[w] = e
    procs.stop(p)
    return res


def median_pass(passes):
    """The per-figure median of several cpu_pass results."""
    out = {}
    for w in WORKLOADS:
        rs = [ps[w] for ps in passes]
        e = {"requests": sum(r["requests"] for r in rs),
             "rps": statistics.median(r["rps"] for r in rs),
             "errors": sum(r["errors"] if isinstance(r["errors"], int)
                           else 0 for r in rs),
             "rounds": rs}
        for role in ("frontend", "broker"):
            e[role] = (statistics.median(r[role][0] for r in rs),
                       statistics.median(r[role][1] for r in rs))
        out[w] = e
    return out


def plain_pass(procs, args, workers, bodies):
    """--rounds CPU passes (alternating with --compare-build's when
    given), then strace on one more gateway. Returns (median figures,
    syscall figures, the comparison build's median figures or None)."""
    mine, base = [], []
    for i in range(args.rounds):
        if args.compare_build:
            base.append(cpu_pass(procs, args, workers, bodies,
                                 args.compare_build, f"base-{i}"))
        mine.append(cpu_pass(procs, args, workers, bodies, None,
                             f"plain-{i}"))
    res = median_pass(mine)
    cmp = median_pass(base) if base else None
    p, port = start_gateway(procs, args, workers, "smg-strace")
    pids = role_pids(p.pid)
    for w in WORKLOADS:
        load(procs, args, port, bodies[w][0], 1, workers)  # warm-up
    # Syscalls per request: strace -c on each process, short runs.
    sys_res = {}
    for w in WORKLOADS:
        tr = {}
        for role, pid in pids.items():
            tr[role] = os.path.join(procs.tmp, f"strace-{w}-{role}.txt")
            procs.start(f"strace-{w}-{role}",
                        ["strace", "-c", "-f", "-p", str(pid), "-o",
                         tr[role]])
        time.sleep(1.0)
        _, n = load(procs, args, port, bodies[w][0], args.strace_secs,
                    workers)
        for q in [q for q in procs.procs
                  if q.bench_name.startswith(f"strace-{w}-")]:
            q.send_signal(signal.SIGINT)
            q.wait(timeout=20)
            procs.procs.remove(q)
        sys_res[w] = {"requests": n}
        for role, path in tr.items():
            sys_res[w][role] = parse_strace(path)
        log(f"strace {w}: {n} requests, frontend "
            f"{sys_res[w]['frontend']['total'] / max(n, 1):.2f} "
            f"syscalls/request, broker "
            f"{sys_res[w]['broker']['total'] / max(n, 1):.2f}")
    procs.stop(p)
    return res, sys_res, cmp


def parse_strace(path):
    """{"total": calls, "calls": {name: calls}} of an strace -c file."""
    out = {"total": 0, "calls": {}}
    try:
        with open(path) as f:
            for ln in f:
                m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(\d+\s+)?"
                             r"(\S+)$", ln)
                if not m:
                    continue
                if m.group(3) == "total":
                    out["total"] = int(m.group(1))
                else:
                    out["calls"][m.group(3)] = int(m.group(1))
    except OSError:
        pass
    return out


def cg_pass(procs, args, workers, bodies):
    outdir = os.path.join(procs.tmp, "cg")
    os.makedirs(outdir)
    wrapper = ["valgrind", "--tool=callgrind", "--trace-children=yes",
               "--trace-children-skip=*smg-poller*",
               f"--callgrind-out-file={outdir}/cg.%p"]
    p, port = start_gateway(procs, args, workers, "smg-cg", wrapper)
    pids = role_pids(p.pid, 60.0)
    res = {}
    for w in WORKLOADS:
        load(procs, args, port, bodies[w][0], 3, workers)  # warm-up
        for pid in pids.values():
            subprocess.run(["callgrind_control", "-z", str(pid)],
                           capture_output=True, timeout=60)
        r, n = load(procs, args, port, bodies[w][0], args.cg_secs, workers)
        for pid in pids.values():
            subprocess.run(["callgrind_control", "-d", str(pid)],
                           capture_output=True, timeout=60)
        res[w] = {"requests": n}
        for role, pid in pids.items():
            files = sorted(glob.glob(f"{outdir}/cg.{pid}.*"),
                           key=os.path.getmtime)
            res[w][role] = annotate(files[-1]) if files else None
        log(f"callgrind {w}: {n} requests, frontend "
            f"{res[w]['frontend']['total'] / max(n, 1):.0f} Ir/request, "
            f"broker {res[w]['broker']['total'] / max(n, 1):.0f}")
    procs.stop(p)
    return res


def annotate(path):
    """{"total": Ir, "funcs": [(Ir, file, function, object)]}: self cost
    of every function in a callgrind dump."""
    r = subprocess.run(["callgrind_annotate", "--threshold=100",
                        "--inclusive=no", "--auto=no", path],
                       capture_output=True, text=True, timeout=300)
    out = {"total": 0, "funcs": []}
    listing = False
    for ln in r.stdout.splitlines():
        if ln.startswith("Ir") and "file:function" in ln:
            listing = True
            continue
        if not listing and "PROGRAM TOTALS" not in ln:
            continue
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+PROGRAM TOTALS", ln)
        if m:
            out["total"] = int(m.group(1).replace(",", ""))
            continue
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*?):(\S+)"
                     r"(?:\s+\[(.*)\])?\s*$", ln)
        if m:
            out["funcs"].append((int(m.group(1).replace(",", "")),
                                 m.group(2), m.group(3), m.group(4) or ""))
    # A dump taken mid-run charges the whole run to the frames still on
    # the stack (main, libc's start): those are not self cost.
    out["funcs"] = [f for f in out["funcs"]
                    if f[0] < 0.98 * out["total"]]
    return out


def stage_of(rules, file, func, obj):
    for name, frx, fnrx in rules:
        where = file if file != "???" else obj
        if (re.search(frx, where) or re.search(frx, obj)) and \
                re.search(fnrx, func):
            return name
    return OTHER


LIBC = "libc (malloc, memcpy, string, syscall stubs)"


def group(rules, ann):
    """({stage: Ir}, top functions of "other", top functions of libc),
    the tops as [(Ir, name)]."""
    g, other, libc = {}, [], []
    for ir, file, func, obj in ann["funcs"]:
        s = stage_of(rules, file, func, obj)
        g[s] = g.get(s, 0) + ir
        name = f"{func} [{os.path.basename(obj) or os.path.basename(file)}]"
        if s == OTHER:
            other.append((ir, name))
        elif s == LIBC:
            libc.append((ir, func))
    listed = sum(g.values())
    if ann["total"] > listed:
        g[OTHER] = g.get(OTHER, 0) + ann["total"] - listed
    return g, sorted(other, reverse=True)[:5], sorted(libc, reverse=True)[:6]


def report(args, m, plain, sysc, cg, cmp=None):
    L = ["# smg-c request path: CPU per request by stage\n"]
    L.append(f"- date: {m['date']}; commit {m['commit']}")
    L.append(f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['kernel']}; "
             f"load average (1 min) {m['load']:.2f} at start, "
             f"{os.getloadavg()[0]:.2f} at end")
    L.append(f"- build: `{args.build_dir}` ({args.build_type})")
    L.append(f"- command: `{' '.join(args.argv)}`")
    L.append(f"- gateway: smg --frontends 1 --policy round_robin, 2 "
             f"smg-simworker --time-scale 0; load: wrk -t{args.threads} "
             f"-c{args.conns}; {args.rounds} plain passes of {args.secs} s "
             f"per workload, "
             f"strace {args.strace_secs} s, callgrind {args.cg_secs} s")
    L.append("")
    for w in WORKLOADS:
        p = plain[w]
        L.append(f"## {datapath.WORKLOAD_TITLES[w]}\n")
        per = ", ".join(f"{r['frontend'][0]:.1f}+{r['frontend'][1]:.1f}"
                        for r in p["rounds"])
        L.append(f"Plain passes: {len(p['rounds'])} x {args.secs} s, "
                 f"{p['requests']} requests, median {p['rps']:.0f} req/s, "
                 f"errors {p['errors']}. CPU per request (medians): "
                 f"frontend {p['frontend'][0]:.1f} µs user + "
                 f"{p['frontend'][1]:.1f} µs system (per pass: {per}), "
                 f"broker {p['broker'][0]:.1f} µs user + "
                 f"{p['broker'][1]:.1f} µs system.\n")
        if cmp:
            c = cmp[w]
            rows = []
            for role in ("frontend", "broker"):
                for k, title in ((0, "user"), (1, "system")):
                    a, b = c[role][k], p[role][k]
                    rows.append([f"{role} {title} µs/request",
                                 f"{a:.1f}", f"{b:.1f}",
                                 f"{b / a:.2f}" if a else "n/a"])
            rows.append(["req/s (median)", f"{c['rps']:.0f}",
                         f"{p['rps']:.0f}",
                         f"{p['rps'] / c['rps']:.2f}" if c["rps"] else
                         "n/a"])
            L.append(f"Against `{args.compare_build}` (passes "
                     f"alternating, same load):\n")
            L += md_table(["figure", "compared build", "this build",
                           "this / compared"], "lrrr", rows)
            L.append("")
        for role, rules in (("frontend", FRONTEND_STAGES),
                            ("broker", BROKER_STAGES)):
            c = cg.get(w, {}) if cg else {}
            ann = c.get(role)
            n = c.get("requests", 0)
            rows = []
            user, system = p[role]
            if ann and ann["total"] and n:
                g, _, _ = group(rules, ann)
                order = []
                for name, _, _ in rules:
                    if name not in order:
                        order.append(name)
                order.append(OTHER)
                for name in order:
                    ir = g.get(name, 0)
                    if not ir:
                        continue
                    share = ir / ann["total"]
                    rows.append([name, f"{ir / n:.0f}",
                                 f"{100 * share:.1f}",
                                 f"{user * share:.1f}"])
                rows.append(["**user total**", f"{ann['total'] / n:.0f}",
                             "100.0", f"{user:.1f}"])
            else:
                rows.append(["user total (no callgrind figures)", "", "",
                             f"{user:.1f}"])
            s = sysc[w]
            nsys = s[role]["total"] / max(s["requests"], 1)
            top = sorted(s[role]["calls"].items(), key=lambda kv: -kv[1])[:5]
            rows.append([f"kernel (system CPU): {nsys:.2f} syscalls per "
                         "request (" + ", ".join(
                             f"{k} {v / max(s['requests'], 1):.2f}"
                             for k, v in top) + ")", "", "",
                         f"{system:.1f}"])
            rows.append(["**total**", "", "", f"{user + system:.1f}"])
            L.append(f"### {role} ({n} requests under callgrind)\n")
            L += md_table(["stage", "Ir per request", "% of Ir",
                           "µs CPU per request"], "lrrr", rows)
            if ann and ann["total"] and n:
                _, other, libc = group(rules, ann)
                if libc:
                    L.append("\nLargest libc functions (Ir per request): " +
                             "; ".join(f"{f} {ir / n:.0f}"
                                       for ir, f in libc) + ".")
                if other:
                    L.append("\nLargest functions in \"other\" (Ir per "
                             "request): " +
                             "; ".join(f"{f} {ir / n:.0f}"
                                       for ir, f in other) + ".")
            L.append("")
    return "\n".join(L) + "\n"


def main():
    args = parse_args()
    trap_signals()
    for tool in ("wrk", "valgrind", "callgrind_control", "callgrind_annotate",
                 "strace"):
        if shutil.which(tool) is None:
            sys.exit(f"request_cost.py: {tool} not found in PATH")
    m = machine()
    tmp = tempfile.mkdtemp(prefix="smg-cost-")
    procs = Procs(tmp, log)
    try:
        log(f"temp dir {tmp}")
        bodies = datapath.bodies_for(tmp, args.prompt_bytes)
        workers = []
        for i in (1, 2):
            workers.append(start_simworker(
                procs, os.path.join(args.build_dir, "smg-simworker"),
                f"worker{i}", ["--time-scale", "0", "--model", MODEL,
                               "--worker-id", f"w{i}",
                               "--log-level", "warn"])[1])
        plain, sysc, cmp = plain_pass(procs, args, workers, bodies)
        cg = None if args.skip_callgrind else \
            cg_pass(procs, args, workers, bodies)
        text = report(args, m, plain, sysc, cg, cmp)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
            log(f"report written to {args.out}")
    except (KeyboardInterrupt, Interrupted) as e:
        log(f"interrupted ({e or 'Ctrl-C'}); stopping every process")
        return 130
    finally:
        finish(procs, tmp, args.keep_tmp, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
