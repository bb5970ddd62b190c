"""Logs: the access line per request, --log-json, --log-dir with reopen on
SIGUSR1, --no-access-log."""
import json
import os
import signal

import gw
import sim
import util

RR = ("--policy", "round_robin")
CHAT = {"model": "sim-model", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}]}


def test_access_line_text(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, *RR, "--worker-urls", w.url) as g:
            g.wait_ready(1)
            r = g.post("/v1/chat/completions", CHAT,
                       headers={"x-request-id": "req-abc-1"})
            assert r.status == 200
            rid = r.headers.get("x-request-id")
            assert rid
            line = util.wait_for(
                lambda: next((ln for ln in g.log().splitlines()
                              if "access: POST /v1/chat/completions 200"
                              in ln), None), what="the access line")
            assert f"worker={w.url} " in line, line
            assert f"bytes={len(r.body)}" not in line  # head counted too
            nbytes = int(line.split("bytes=")[1].split()[0])
            assert nbytes > len(r.body), line
            assert float(line.split("latency_ms=")[1].split()[0]) >= 0
            assert line.endswith(f"request_id={rid}"), line
            assert g.get("/nope").status == 404
            util.wait_for(lambda: "access: GET other 404 worker=- " in
                          g.log(), what="the 404 access line")
            g.stop()
    finally:
        w.stop()


def test_json_log_dir_and_reopen(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    logs = tmp_path / "logs"
    try:
        with gw.start_gateway(tmp_path, *RR, "--worker-urls", w.url,
                              "--log-json", "--log-dir", logs,
                              frontends=2) as g:
            g.wait_ready(1)
            for _ in range(4):
                assert g.post("/v1/chat/completions", CHAT).status == 200
            names = {"smg.log", "smg-broker.log", "smg-poller.log",
                     "smg-frontend.log"}
            util.wait_for(lambda: names <= set(os.listdir(logs)),
                          what="one file per role")
            fe = logs / "smg-frontend.log"

            def access(path):
                out = []
                for ln in path.read_text().splitlines():
                    o = json.loads(ln)  # every line is one JSON object
                    assert {"ts", "level", "role", "pid", "msg"} <= set(o)
                    if o["msg"] == "access":
                        out.append(o)
                return out
            def chats(path):
                return [o for o in access(path)
                        if o["path"] == "/v1/chat/completions"]
            acc = util.wait_for(lambda: len(chats(fe)) >= 4 and chats(fe),
                                what="4 access lines")
            a = acc[0]
            assert a["method"] == "POST" and \
                a["path"] == "/v1/chat/completions"
            assert a["status"] == 200 and a["worker"] == w.url
            assert a["bytes"] > 0 and a["latency_ms"] >= 0
            assert a["request_id"] and a["level"] == "info"
            assert a["role"] == "smg-frontend"
            for n in names:
                for ln in (logs / n).read_text().splitlines():
                    json.loads(ln)
            # logrotate: move the files away, SIGUSR1 to the launcher.
            for n in names:
                os.rename(logs / n, logs / (n + ".1"))
            g.proc.send_signal(signal.SIGUSR1)
            util.wait_for(lambda: names <= set(os.listdir(logs)),
                          what="the files reopened")
            assert g.post("/v1/chat/completions", CHAT).status == 200
            util.wait_for(lambda: len(chats(fe)) >= 1,
                          what="an access line in the new file")
            assert "log file reopened" in (logs / "smg-broker.log") \
                .read_text()
            before = g.pids()
            g.stop()
            assert all(before.values())
    finally:
        w.stop()


def test_no_access_log(tmp_path):
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, *RR, "--worker-urls", w.url,
                              "--no-access-log") as g:
            g.wait_ready(1)
            assert g.post("/v1/chat/completions", CHAT).status == 200
            assert g.get("/nope").status == 404
            assert "access:" not in g.log()
            g.stop()
    finally:
        w.stop()
