"""benchlib.py: the harness shared by the benchmarks in tests/bench.

datapath.py, mooncake.py and load_bench.py use it, and every new benchmark
should too rather than carry its own copy. It holds, each as one small
function or class:

  * processes: free_port(), Procs (every child in its own process group,
    stopped on exit, Ctrl-C, SIGTERM and failure, strays included),
    Interrupted and trap_signals();
  * readiness: wait_for(), wait_port(), wait_port_file(), http_call(),
    smg_ready();
  * what a benchmark starts: start_simworker() (--port 0 --port-file),
    start_smg() (run and state dirs in the run's temp dir), nginx_conf()
    and start_nginx(), haproxy_conf() and start_haproxy() (both in the
    foreground, so Procs can stop them);
  * figures: percentile(), nearest_rank(), scrape() and the Prometheus
    histogram and counter helpers;
  * the command line and the report: add_build_dir(), add_out(), machine(),
    build_type(), first_line(), md_table().

Standard library only; everything listens on 127.0.0.1 only.
"""
import datetime
import http.client
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def add_build_dir(ap, holds):
    """Adds --build-dir to an ArgumentParser: default $SMG_BUILD_DIR, else
    build-release/; its help is holds, then the default."""
    ap.add_argument("--build-dir",
                    default=os.environ.get("SMG_BUILD_DIR",
                                           os.path.join(ROOT,
                                                        "build-release")),
                    help=f"{holds} (default: build-release/)")


def add_out(ap):
    """Adds --out, the file the Markdown report is also written to."""
    ap.add_argument("--out", help="also write the Markdown report here")


def logger(tag=None):
    """A log(msg) function writing to stderr, each line prefixed with
    [tag], or with the wall-clock time when tag is None."""
    def log(msg):
        head = tag if tag is not None else time.strftime("%H:%M:%S")
        print(f"[{head}] {msg}", file=sys.stderr, flush=True)
    return log


def free_port():
    """A TCP port of 127.0.0.1 free at the time of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- processes


class Interrupted(BaseException):
    """Raised by the handler trap_signals() installs. A BaseException, so
    that the handlers of a run's own errors do not swallow it."""


def _raise_interrupted(signum, _frame):
    raise Interrupted(f"signal {signum}")


def trap_signals(sigs=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
    """Makes each of sigs raise Interrupted, so the run unwinds through
    its finally blocks (where Procs.stop_all() stops every child)."""
    for s in sigs:
        signal.signal(s, _raise_interrupted)


def ignore_signals(sigs=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
    """Ignores sigs from now on: a second Ctrl-C does not cut cleanup."""
    for s in sigs:
        signal.signal(s, signal.SIG_IGN)


class Procs:
    """Processes started by a run, each in its own process group with its
    output in <tmp>/<name>.log; stop() and stop_all() end whole groups."""

    def __init__(self, tmp, log=None):
        self.tmp = tmp
        self.log = log or logger()
        self.procs = []

    def start(self, name, argv, env=None):
        """Starts argv in the background; returns the Popen, whose
        bench_name is name."""
        out = open(os.path.join(self.tmp, name + ".log"), "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        out.close()
        p.bench_name = name
        self.procs.append(p)
        return p

    def run(self, argv, env, timeout):
        """Runs argv to completion in its own group; (rc, stdout, stderr),
        (-1, stdout, "timed out") when it ran past timeout seconds."""
        p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        p.bench_name = os.path.basename(argv[0])
        self.procs.append(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(p)
            out, err = p.communicate()
            return -1, out.decode(errors="replace"), "timed out"
        finally:
            if p in self.procs and p.poll() is not None:
                self.procs.remove(p)
        return p.returncode, out.decode(errors="replace"), \
            err.decode(errors="replace")

    @staticmethod
    def _signal_group(p, sig):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, p, grace=5.0):
        """SIGTERM to p's group, SIGKILL after grace seconds; then SIGKILL
        to the group anyway, which may outlive its leader (the children
        of the smg launcher)."""
        if p.poll() is None:
            self._signal_group(p, signal.SIGTERM)
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(p, signal.SIGKILL)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.log(f"{p.bench_name} (pid {p.pid}) did not exit")
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        """Stops every process still running, the last started first, and
        any stray left behind."""
        for p in reversed(list(self.procs)):
            self.stop(p)
        self._kill_strays()

    def _kill_strays(self):
        """Kills any process whose command line names the run's temp dir
        (a child that moved to a session of its own)."""
        me = os.getpid()
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == me:
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().decode(errors="replace")
            except OSError:
                continue
            if self.tmp in cmd:
                self.log(f"killing stray pid {d}: "
                         f"{cmd.replace(chr(0), ' ')[:80]}")
                try:
                    os.kill(int(d), signal.SIGKILL)
                except OSError:
                    pass


# ---------------------------------------------------------------- readiness


def http_call(port, method, path, body=None, timeout=5.0):
    """(status, headers with lower-case names, body bytes) of one request
    to 127.0.0.1:port; a body is sent as application/json."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json"} if body else {}
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def wait_for(pred, timeout, what, proc=None, interval=0.05):
    """Polls pred() until true; a pred raising OSError or HTTPException
    counts as false. RuntimeError when proc exits or timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited {proc.returncode}")
        try:
            if pred():
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


def wait_port(port, timeout, what, proc=None):
    """Waits until 127.0.0.1:port accepts a TCP connection."""
    def accepts():
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    wait_for(accepts, timeout, what, proc)


def wait_port_file(path, proc, timeout=10.0):
    """The port a process started with --port 0 --port-file path wrote;
    RuntimeError when proc exits first or timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.bench_name} exited with status "
                               f"{proc.returncode}")
        try:
            with open(path) as f:
                s = f.read().strip()
            if s:
                return int(s)
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{path}: no port after {timeout}s")


def smg_ready(port, workers, timeout=2.0):
    """(ready, why): whether smg's GET /readiness answers 200 with at
    least `workers` healthy workers; why says what was seen otherwise."""
    st, _, data = http_call(port, "GET", "/readiness", timeout=timeout)
    try:
        n = json.loads(data).get("healthy_workers", 0) if st == 200 else 0
    except (ValueError, AttributeError):
        n = 0
    if st == 200 and n >= workers:
        return True, None
    return False, f"readiness: HTTP {st}: {data[:120]!r}"


# ---------------------------------------------------------------- targets


def start_simworker(procs, binary, name, args, timeout=10.0):
    """Starts `binary --port 0 --port-file <tmp>/<name>.port args...` and
    waits for its port; returns (proc, port)."""
    pf = os.path.join(procs.tmp, name + ".port")
    if os.path.exists(pf):
        os.unlink(pf)
    p = procs.start(name, [binary, "--port", "0", "--port-file", pf] +
                    list(args))
    return p, wait_port_file(pf, p, timeout)


def start_smg(procs, binary, name, args, host=None):
    """Starts smg on two free ports with --run-dir <tmp>/run-<name> and
    --state-dir <tmp>/state-<name>, then args; with host, both listeners
    bind it. Does not wait; returns (proc, port, prometheus port)."""
    port, prom = free_port(), free_port()
    argv = [binary]
    if host is not None:
        argv += ["--host", host, "--prometheus-host", host]
    argv += ["--port", str(port), "--prometheus-port", str(prom),
             "--run-dir", os.path.join(procs.tmp, f"run-{name}"),
             "--state-dir", os.path.join(procs.tmp, f"state-{name}")]
    return procs.start(name, argv + list(args)), port, prom


def nginx_conf(tmp, port, workers, cores, generator, http_extra=(),
               location_extra=()):
    """nginx.conf proxying 127.0.0.1:port round robin to the worker ports,
    keep-alive upstreams, unbuffered; http_extra and location_extra are
    more directives for those blocks."""
    ups = "\n".join(f"        server 127.0.0.1:{w};" for w in workers)
    hx = "".join(f"    {d};\n" for d in http_extra)
    lx = "".join(f"            {d};\n" for d in location_extra)
    return f"""# generated by tests/bench/{generator}
worker_processes {cores};
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
{hx}    keepalive_requests 1000000;
    upstream workers {{
{ups}
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://workers;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
{lx}        }}
    }}
}}
"""


def start_nginx(procs, conf_text):
    """Writes <tmp>/nginx.conf and starts nginx on it in the foreground
    (its temp and log files in tmp too); returns the proc."""
    tmp = procs.tmp
    for d in ("nginx-body", "nginx-proxy"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(conf_text)
    return procs.start("nginx", ["nginx", "-p", tmp + "/", "-e",
                                 os.path.join(tmp, "nginx-error.log"),
                                 "-c", conf])


def haproxy_conf(port, servers, threads, generator, balance="roundrobin",
                 timeout="60s", defaults_extra=()):
    """haproxy.cfg for HTTP on 127.0.0.1:port balancing over servers, a
    list of (name, port); defaults_extra are more `defaults` lines."""
    srv = "\n".join(f"    server {n} 127.0.0.1:{p}" for n, p in servers)
    dx = "".join(f"    {d}\n" for d in defaults_extra)
    return f"""# generated by tests/bench/{generator}
global
    nbthread {threads}
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client {timeout}
    timeout server {timeout}
{dx}frontend bench
    bind 127.0.0.1:{port}
    default_backend workers
backend workers
    balance {balance}
{srv}
"""


def start_haproxy(procs, conf_text):
    """Writes <tmp>/haproxy.cfg and starts HAProxy on it in the foreground
    (-db); returns the proc."""
    conf = os.path.join(procs.tmp, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(conf_text)
    return procs.start("haproxy", ["haproxy", "-db", "-f", conf])


# ---------------------------------------------------------------- figures


def percentile(vals, q):
    """The value at index round(q * (n - 1)) of the sorted values, q in
    [0, 1]; NaN for no values."""
    if not vals:
        return float("nan")
    s = sorted(vals)
    return s[max(0, min(len(s) - 1, int(round(q * (len(s) - 1)))))]


def nearest_rank(vals, q):
    """Nearest-rank q-quantile of a non-empty list, q in (0, 1]."""
    v = sorted(vals)
    return v[max(0, math.ceil(q * len(v)) - 1)]


METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def scrape(port):
    """GET /metrics -> {(name, labels): value}, or None if unreachable."""
    try:
        st, _, data = http_call(port, "GET", "/metrics")
    except (OSError, http.client.HTTPException):
        return None
    if st != 200:
        return None
    out = {}
    for ln in data.decode(errors="replace").splitlines():
        m = METRIC_LINE.match(ln)
        if m:
            try:
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def histogram_delta(before, after, family):
    """Bucket counts (upper bound, cumulative count) of after - before, the
    sum and the count of a histogram family; None if it is absent."""
    buckets = []
    for (name, labels), v in after.items():
        if name != family + "_bucket":
            continue
        m = re.search(r'le="([^"]+)"', labels)
        if not m:
            continue
        le = math.inf if m.group(1) == "+Inf" else float(m.group(1))
        buckets.append((le, v - before.get((name, labels), 0.0)))
    if not buckets:
        return None
    buckets.sort()
    key_sum, key_count = (family + "_sum", ""), (family + "_count", "")
    return {
        "buckets": buckets,
        "sum": after.get(key_sum, 0.0) - before.get(key_sum, 0.0),
        "count": after.get(key_count, 0.0) - before.get(key_count, 0.0),
    }


def histogram_quantile(q, buckets):
    """Prometheus-style: linear interpolation inside the bucket holding
    the q-quantile, lower bound 0 for the first; returns (value, exact)
    where exact is False when the quantile lies in the +Inf bucket."""
    total = buckets[-1][1]
    if total <= 0:
        return None, True
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le, False
            if c == prev_c:
                return le, True
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c), \
                True
        prev_le, prev_c = le, c
    return prev_le, False


def counter_delta(before, after, family):
    """after - before summed over every series of a counter family; None
    if it is absent."""
    keys = [k for k in after if k[0] == family]
    if not keys:
        return None
    return sum(after[k] - before.get(k, 0.0) for k in keys)


# ---------------------------------------------------------------- report


def first_line(argv):
    """The first line argv prints (stdout, then stderr), or "unknown"."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (p.stdout + p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def build_type(build_dir):
    """CMAKE_BUILD_TYPE of a build dir, or "unknown"."""
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            for ln in f:
                if ln.startswith("CMAKE_BUILD_TYPE:"):
                    return ln.split("=", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine(tools=()):
    """What a report says of the machine: nproc (usable CPUs), cpus (all),
    cpu (model), mem (GiB), arch, kernel, platform, load (1 min average),
    date (UTC), commit (of this tree), python, and for each of tools the
    first line of `tool -v`, under the tool's name."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    model = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    commit = first_line(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain",
                            "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    m = {
        "nproc": len(os.sched_getaffinity(0)),
        "cpus": os.cpu_count(),
        "cpu": model,
        "mem": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        / 2 ** 30,
        "arch": platform.machine(),
        "kernel": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(),
        "load": os.getloadavg()[0],
        "date": datetime.datetime.now(datetime.timezone.utc)
        .strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "python": platform.python_version(),
    }
    for tool in tools:
        m[tool] = first_line([tool, "-v"])
    return m


def md_row(cells):
    """One Markdown table row; an empty cell is written `| |`."""
    return "|" + "".join(f" {c} |" if c != "" else " |" for c in cells)


def md_table(header, align, rows):
    """A Markdown table as a list of lines: header cells, align a string
    with one letter per column (l: left, r: right), rows of cells."""
    sep = "|" + "".join("---:|" if a == "r" else "---|" for a in align)
    return [md_row(header), sep] + [md_row(r) for r in rows]
