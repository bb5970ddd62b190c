"""benchlib.py: the harness shared by the benchmarks in tests/bench.

datapath.py, mooncake.py, routing.py, multihost.py and load_bench.py use it, and every new benchmark
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
    build_type(), first_line(), md_table();
  * trace replay (mooncake.py, routing.py, multihost.py): Mooncake-format requests
    (load_trace(), block_lengths(), oracle_bound()), their prompts
    (Bodies), a fleet of simworkers (Fleet), smg started per policy
    (start_smg_target(), probe(), refusal()), the asyncio client
    (replay(), one_request()) and CPU accounting (host_cpu(),
    rusage_secs()).

Standard library only; everything listens on 127.0.0.1 only.
"""
import asyncio
import datetime
import hashlib
import http.client
import json
import math
import os
import platform
import re
import resource
import shutil
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


def finish(procs, tmp, keep, log):
    """The end of a run, however it ends: every child stopped (a second
    Ctrl-C ignored meanwhile), then tmp removed, or kept and named."""
    ignore_signals()
    procs.stop_all()
    if keep:
        log(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


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

# ---------------------------------------------------------------- replay
#
# Trace replay through a gateway to simworkers (mooncake.py, routing.py):
# Mooncake-format requests (timestamp ms, input_length, output_length,
# hash_ids of 512-token blocks), their prompts, the fleet, the client.

SIM_MODEL = "sim-model"
BLOCK_TOKENS = 512
CHARS_PER_TOKEN = 4  # the simworker's tokenizer: one token per 4 chars
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN
# Lines of the smg log that mean the broker refused the policy.
SMG_REFUSALS = ("not implemented", "unknown policy", "invalid value")


def load_trace(path, n):
    """The first n requests of a Mooncake-format trace (all when n is 0);
    ValueError when a request's input_length does not match its blocks."""
    reqs = []
    with open(path) as f:
        for ln in f:
            if ln.strip():
                reqs.append(json.loads(ln))
            if n and len(reqs) >= n:
                break
    for r in reqs:
        blocks = r["hash_ids"]
        if not blocks or not (len(blocks) - 1) * BLOCK_TOKENS < \
                r["input_length"] <= len(blocks) * BLOCK_TOKENS:
            raise ValueError(f"{path}: input_length {r['input_length']} "
                             f"does not match {len(blocks)} blocks")
    return reqs


def block_lengths(r):
    """Tokens of each block of r's prompt (the last one may be cut)."""
    n = r["input_length"]
    return [min(BLOCK_TOKENS, n - i * BLOCK_TOKENS)
            for i in range(len(r["hash_ids"]))]


def oracle_bound(reqs):
    """Share of prompt tokens a perfect router could serve from cache:
    walking each prompt's blocks from the start, a block's tokens count
    while an earlier request held at least as many tokens of that block
    (a block seen only cut shorter counts its seen part and ends the
    prefix); the first block not seen ends it too. Caches are unbounded
    here. Returns (hit tokens, prompt tokens)."""
    seen = {}  # block id -> most tokens of it any earlier prompt had
    hit = total = 0
    for r in reqs:
        lens = block_lengths(r)
        total += sum(lens)
        for b, n in zip(r["hash_ids"], lens):
            s = seen.get(b, 0)
            hit += min(s, n)
            if s < n:
                break
        for b, n in zip(r["hash_ids"], lens):
            if seen.get(b, 0) < n:
                seen[b] = n
    return hit, total


def block_text(bid):
    """2,048 characters (512 tokens) unique to block id bid: hex of
    BLAKE2b over (id, counter). Equal ids give equal text."""
    parts = [hashlib.blake2b(f"mooncake-block:{bid}:{k}".encode(),
                             digest_size=64).hexdigest()
             for k in range(BLOCK_CHARS // 128)]
    return "".join(parts).encode()


class Bodies:
    """Request bodies built on demand from cached block texts: a streamed
    completion of the request's prompt with max_tokens = its output_length
    (at least 1)."""

    def __init__(self, reqs):
        self.text = {}
        for r in reqs:
            for b in r["hash_ids"]:
                if b not in self.text:
                    self.text[b] = block_text(b)

    def prompt(self, r):
        s = b"".join(self.text[b] for b in r["hash_ids"])
        return s[:r["input_length"] * CHARS_PER_TOKEN]

    def body(self, r):
        head = json.dumps({"model": SIM_MODEL,
                           "max_tokens": max(1, r["output_length"]),
                           "stream": True})
        # The prompt is hex: no JSON escaping needed.
        return head[:-1].encode() + b', "prompt": "' + self.prompt(r) + \
            b'"}'


class Fleet:
    """smg-simworkers w1..wn of one target, each started with
    --model SIM_MODEL --worker-id wi and its own list of flags."""

    def __init__(self, procs, binary, tag, worker_args):
        self.procs = procs
        self.ports = []
        self.plist = []
        for i, wargs in enumerate(worker_args):
            p, port = start_simworker(procs, binary, f"{tag}-w{i + 1}", [
                "--host", "127.0.0.1", "--model", SIM_MODEL,
                "--worker-id", f"w{i + 1}", "--log-level", "warn"] +
                list(wargs))
            self.plist.append(p)
            self.ports.append(port)

    def urls(self):
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def reset(self):
        """Flushes every cache and zeroes every worker's statistics."""
        for p in self.ports:
            for path in ("/flush_cache", "/sim/reset_stats"):
                st, _, data = http_call(p, "POST", path)
                if st != 200:
                    raise RuntimeError(f"worker {p} {path}: HTTP {st}: "
                                       f"{data[:100]!r}")

    def stats(self):
        """Each worker's GET /sim/stats, in order."""
        out = []
        for p in self.ports:
            st, _, data = http_call(p, "GET", "/sim/stats")
            if st != 200:
                raise RuntimeError(f"worker {p} /sim/stats: HTTP {st}")
            out.append(json.loads(data))
        return out

    def dead(self):
        return [p.bench_name for p in self.plist if p.poll() is not None]

    def stop(self):
        for p in self.plist:
            self.procs.stop(p)


class NotAvailable(Exception):
    """A target that could not be started (refused policy, not ready)."""


def start_smg_target(procs, binary, name, flags, workers, ready_timeout):
    """Starts smg (127.0.0.1) with flags and waits until it has `workers`
    healthy workers and answers probe(); (proc, port) or NotAvailable,
    saying why (the broker's refusal when its log has one)."""
    p, port, _ = start_smg(procs, binary, name, flags, host="127.0.0.1")
    logf = os.path.join(procs.tmp, name + ".log")
    deadline = time.monotonic() + ready_timeout
    err = "not tried"
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise NotAvailable(refusal(logf) or
                               f"smg exited with status {p.returncode}")
        why = refusal(logf)
        if why:
            raise NotAvailable(why)
        try:
            ready, why_not = smg_ready(port, workers)
            if ready:
                err = probe(port)
                # A broker that dies right after starting shows in the log.
                time.sleep(0.5)
                why = refusal(logf)
                if why:
                    raise NotAvailable(why)
                if err is None:
                    return p, port
            else:
                err = why_not
        except (OSError, http.client.HTTPException, ValueError) as e:
            err = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise NotAvailable(f"not ready after {ready_timeout:.0f}s: {err}")


def probe(port):
    """One short streamed request; None when answered correctly."""
    body = json.dumps({"model": SIM_MODEL, "prompt": "probe " * 8,
                       "max_tokens": 2, "stream": True}).encode()
    st, _, data = http_call(port, "POST", "/v1/completions", body)
    if st != 200:
        return f"HTTP {st}: {data[:160]!r}"
    if b"data: [DONE]" not in data:
        return f"stream without [DONE]: {data[-120:]!r}"
    return None


def refusal(log_path):
    """The log line saying the policy was refused, or None."""
    try:
        with open(log_path, errors="replace") as f:
            for ln in f:
                if "smg-broker" in ln and "error" in ln and \
                        any(m in ln for m in SMG_REFUSALS):
                    return ln.strip().split(": ", 1)[-1]
                if "smg-broker" in ln and "exited with status" in ln:
                    return ln.strip().split(": ", 1)[-1]
    except OSError:
        pass
    return None


class Result:
    """One replayed request: sched is the loop time it was due (for a
    request that waits for the one before it, the time it could go),
    times are from sched, worker is the x-sim-worker that answered."""
    __slots__ = ("idx", "sched", "lag", "status", "ttft", "e2e", "error",
                 "worker")

    def __init__(self, idx, sched):
        self.idx = idx
        self.sched = sched
        self.lag = 0.0
        self.status = 0
        self.ttft = None
        self.e2e = None
        self.error = None
        self.worker = None


async def read_head(reader):
    """(status, headers with lower-case names) of an HTTP/1.x response."""
    line = await reader.readline()
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ValueError(f"bad status line {line[:60]!r}")
    status = int(parts[1])
    hdrs = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            raise ValueError("connection closed in the headers")
        k, _, v = line.decode("latin-1").partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs


class Chunked:
    """Incremental decoder of a chunked body: feed() raw bytes, get the
    payload pieces; done once the last chunk and trailers are in."""

    def __init__(self):
        self.buf = bytearray()
        self.done = False

    def feed(self, data):
        self.buf += data
        out = []
        while not self.done:
            eol = self.buf.find(b"\r\n")
            if eol < 0:
                break
            size = int(bytes(self.buf[:eol]).split(b";")[0].strip(), 16)
            if size == 0:
                if self.buf.find(b"\r\n\r\n", eol) < 0:
                    break  # trailers not complete yet
                self.done = True
                break
            if len(self.buf) < eol + 2 + size + 2:
                break
            out.append(bytes(self.buf[eol + 2:eol + 2 + size]))
            del self.buf[:eol + 2 + size + 2]
        return out


async def read_body(reader, writer, hdrs, feed, batch):
    """Calls feed(bytes) with the body as it arrives. Once feed() has
    returned True (the first token is in), the socket is read every batch
    seconds only, so a streamed answer costs a few reads, not one per
    event; later events are then timed to within batch."""
    transport = writer.transport
    chunked = "chunked" in hdrs.get("transfer-encoding", "").lower()
    left = int(hdrs["content-length"]) if not chunked and \
        "content-length" in hdrs else None
    dec = Chunked() if chunked else None
    slow = False
    while True:
        if slow and batch > 0:
            transport.pause_reading()
            await asyncio.sleep(batch)
            transport.resume_reading()
        data = await reader.read(1 << 20)
        if not data:
            if chunked or left:
                raise ValueError("connection closed in the body")
            return
        if dec is not None:
            for piece in dec.feed(data):
                slow = feed(piece) or slow
            if dec.done:
                return
        else:
            if left is not None:
                data = data[:left]
                left -= len(data)
            slow = feed(data) or slow
            if left == 0:
                return


async def one_request(port, body, res, batch):
    """Sends one streamed completion; fills res (times from its scheduled
    send time, so a late client does not hide queueing)."""
    loop = asyncio.get_running_loop()
    res.lag = loop.time() - res.sched
    writer = None
    state = {"tail": b"", "done": False, "err": b""}

    def feed(data):
        now = loop.time()
        if res.status != 200:
            if len(state["err"]) < 200:
                state["err"] += data[:200]
            return False
        if res.ttft is None and b"data: {" in state["tail"] + data:
            res.ttft = now - res.sched
        if not state["done"] and b"data: [DONE]" in state["tail"] + data:
            state["done"] = True
            res.e2e = now - res.sched
        state["tail"] = data[-16:]
        return res.ttft is not None

    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\n"
                     b"Host: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Accept: text/event-stream\r\n"
                     b"Connection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        await writer.drain()
        res.status, hdrs = await read_head(reader)
        res.worker = hdrs.get("x-sim-worker")
        await read_body(reader, writer, hdrs, feed, batch)
        if res.status != 200:
            res.error = f"HTTP {res.status}: " \
                f"{state['err'][:80].decode(errors='replace')}"
        elif not state["done"]:
            res.error = "stream ended without [DONE]"
    except asyncio.CancelledError:
        res.error = "timed out"
        raise
    except (OSError, ValueError, asyncio.IncompleteReadError) as e:
        res.error = f"{type(e).__name__}: {e}"[:120]
    finally:
        if writer is not None:
            writer.close()


async def sample_loads(ports, samples, stop):
    """Samples each worker's waiting queue (GET /v1/loads) every 0.5 s."""
    if not ports:
        return
    loop = asyncio.get_running_loop()

    def get(port):
        try:
            st, _, data = http_call(port, "GET", "/v1/loads", timeout=2)
            if st == 200:
                return json.loads(data)["loads"][0]["num_waiting_reqs"]
        except (OSError, http.client.HTTPException, ValueError, KeyError,
                IndexError):
            pass
        return None

    while not stop.is_set():
        row = await asyncio.gather(*(loop.run_in_executor(None, get, p)
                                     for p in ports))
        if all(x is not None for x in row):
            samples.append(row)
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            pass

async def replay(port, reqs, bodies, speed, read_batch, request_timeout,
                 worker_ports=()):
    """Replays reqs against 127.0.0.1:port: request i is sent at its
    timestamp (ms) / speed from the start, or, when it names the index of
    an earlier request in "after", once that one has ended if that is
    later (a user waits for the answer). port may be a list of ports:
    request i then goes to port[i % len(port)] (one connection per
    request, so this is an L4 balancer's round robin over connections).
    Returns (results, wall seconds from the start to the last [DONE],
    waiting samples of worker_ports)."""
    ports = list(port) if isinstance(port, (list, tuple)) else [port]
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.5
    results = [Result(i, t0 + r["timestamp"] / 1000.0 / speed)
               for i, r in enumerate(reqs)]
    ended = [asyncio.Event() for _ in reqs]
    samples = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_loads(worker_ports, samples, stop))

    async def one(i, r, res):
        try:
            prev = r.get("after")
            if prev is not None:
                await ended[prev].wait()
                res.sched = max(res.sched, loop.time())
            await one_request(ports[i % len(ports)], bodies.body(r), res,
                              read_batch)
        finally:
            ended[i].set()

    tasks = []
    for i, (r, res) in enumerate(zip(reqs, results)):
        delay = res.sched - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(asyncio.wait_for(
            one(i, r, res), request_timeout)))
    # Bounded drain: whatever is still running after the timeout is an
    # error (its wait_for has cancelled it by then).
    done, pending = await asyncio.wait(tasks, timeout=request_timeout + 5)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for res in results:
        if res.error is None and res.e2e is None:
            res.error = "timed out"
    stop.set()
    await sampler
    ends = [res.sched + res.e2e for res in results if res.e2e is not None]
    wall = (max(ends) if ends else loop.time()) - t0
    return results, wall, samples


def host_cpu():
    """(busy, total) CPU seconds of the whole host since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v) - idle) / hz, sum(v) / hz


def rusage_secs(who):
    """User + system CPU seconds of resource.getrusage(who)."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime
