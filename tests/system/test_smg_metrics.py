"""Metrics as SMG exports them: a # HELP and # TYPE line on every family
(promtool check metrics passes on a live scrape), SMG's HTTP families and
labels: smg_http_requests_total{method,path},
smg_http_request_duration_seconds{method,path},
smg_http_responses_total{path,status_code,error_code},
smg_http_connections_active, smg_worker_errors_total{worker_type,
connection_mode,error_type}."""
import re
import shutil
import subprocess

import pytest

import gw
import sim
import util


def families(text):
    helps = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    types = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    return helps, types


def test_smg_families_and_promtool(tmp_path):
    w = sim.start_simworker(tmp_path, "--model", "sim-model",
                            "--time-scale", 0)
    bad = sim.start_simworker(tmp_path, "--model", "sim-model",
                              "--time-scale", 0, "--fail-rate", 1.0,
                              "--fail-status", 503)
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url, bad.url,
                         "--retry-max-retries", 2,
                         "--retry-initial-backoff-ms", 1)
    try:
        g.wait_ready(2)
        body = {"model": "sim-model", "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(6):
            assert g.post("/v1/chat/completions", body).status == 200
        assert g.post("/v1/chat/completions", b"{not json",
                      headers={"Content-Type": "application/json"}
                      ).status == 400
        assert g.get("/nowhere").status == 404

        def scraped():
            m = g.metrics()
            return "smg_http_connections_active" in m and \
                "smg_worker_errors_total" in m and m
        text = util.wait_for(scraped, timeout=5, what="families")
        helps, types = families(text)
        assert types and helps == types, types ^ helps
        assert re.search(r'^smg_http_requests_total\{method="POST",'
                         r'path="/v1/chat/completions"\} \d+', text, re.M)
        assert re.search(r'^smg_http_request_duration_seconds_count\{'
                         r'method="POST",path="/v1/chat/completions"\} [1-9]',
                         text, re.M), text
        assert re.search(r'^smg_http_responses_total\{path="/v1/chat/'
                         r'completions",status_code="200",error_code=""\}',
                         text, re.M)
        assert re.search(r'^smg_http_responses_total\{path="other",'
                         r'status_code="404",error_code="not_found"\}',
                         text, re.M), text
        assert re.search(r'^smg_worker_errors_total\{worker_type="regular",'
                         r'connection_mode="http",'
                         r'error_type="backend_error"\} [1-9]', text, re.M)
        assert "# TYPE smg_http_connections_active gauge" in text
        promtool = shutil.which("promtool")
        if promtool is None:
            pytest.skip("promtool not installed (Debian package prometheus)")
        r = subprocess.run([promtool, "check", "metrics"], input=text,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        g.stop()
        w.stop()
        bad.stop()


def test_process_up_follows_the_broker_and_poller(tmp_path):
    """smg_process_up{role} is 1 for a live broker and poller and drops to
    0 while one of them is frozen (its heartbeat goes stale); the frontend
    count matches --frontends."""
    import os
    import signal
    w = sim.start_simworker(tmp_path, "--model", "sim-model",
                            "--time-scale", 0)
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", w.url, frontends=2)
    stopped = []

    def up(role):
        m = re.search(r'^smg_process_up\{role="%s"\} (\d)' % role,
                      g.metrics(), re.M)
        return int(m.group(1)) if m else None
    try:
        g.wait_ready(1)
        text = g.metrics()
        assert up("broker") == 1 and up("poller") == 1, text
        assert re.search(r"^smg_frontends_up 2$", text, re.M), text
        for role in ("poller", "broker"):
            pid = g.pids()[role][0]
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
            util.wait_for(lambda: up(role) == 0, timeout=10,
                          what=f"{role} down")
            os.kill(pid, signal.SIGCONT)
            stopped.remove(pid)
            util.wait_for(lambda: up(role) == 1, timeout=10,
                          what=f"{role} up again")
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        g.stop()
        w.stop()
