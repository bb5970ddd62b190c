"""cache_aware with simworkers: requests that share a long prefix stay on
the worker that holds it (branch tree_match, one debug line per decision),
and a busy holder spills to another worker exactly when its in-flight
count exceeds both the relative and the absolute gate."""
import re
import threading
import time

import gw
import sim
import util

MODEL = "sim-model"
PREFIX = ("You are a careful assistant. " * 80)  # ~2.3 KB shared prefix


def body(suffix, hold_ms=0):
    b = {"model": MODEL, "prompt": PREFIX + suffix, "max_tokens": 2}
    if hold_ms:
        b["sim_hold_ms"] = hold_ms
    return b


def metric(g, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pat = re.escape(name) + r"\{([^}]*)\} (\d+)"
    total = 0
    for lab, val in re.findall(pat, g.metrics()):
        if all(f'{k}="{v}"' in lab for k, v in labels.items()) or not want:
            total += int(val)
    return total


def test_shared_prefix_sticks_to_one_worker(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--time-scale", "0")
          for _ in range(3)]
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--worker-urls", *[w.url for w in ws],
                              "--log-level", "debug") as g:
            g.wait_ready(3)
            routed = []
            for i in range(20):
                r = g.post("/v1/completions", body(f" question {i}?"))
                assert r.status == 200, r
                routed.append(r.headers["x-smg-routed-worker-id"])
            assert len(set(routed)) == 1, routed
            assert metric(g, "smg_cache_aware_policy_branch_total",
                          branch="tree_match") >= 19
            # Another conversation is free to go elsewhere but then stays.
            other = []
            for i in range(5):
                r = g.post("/v1/completions",
                           {"model": MODEL, "max_tokens": 2,
                            "prompt": "Completely different system text. "
                            * 60 + str(i)})
                assert r.status == 200, r
                other.append(r.headers["x-smg-routed-worker-id"])
            assert len(set(other)) == 1, other
            assert re.search(r"cache_aware model \S+ branch tree_match "
                             r"match 0\.\d+ in_flight \d+ avg [\d.]+ -> "
                             r"http://127\.0\.0\.1:\d+", g.log())
            g.stop()
    finally:
        for w in ws:
            w.stop()


def test_busy_holder_spills_exactly_past_both_gates(tmp_path):
    # Two workers, abs 2, rel 1.5: with the holder at L in flight and the
    # other idle, avg = L/2; L > 1.5 * L/2 always, L > L/2 + 2 from L = 5.
    # So held requests 1..5 stay on the holder and the 6th spills. The
    # prefill is near instant, so no prompt waits for its first token and
    # the spill on work (which would fire earlier) stays out of the way.
    ws = [sim.start_simworker(tmp_path, "--prefill-tps", 10000000)
          for _ in range(2)]
    try:
        with gw.start_gateway(tmp_path, "--policy", "cache_aware",
                              "--worker-urls", *[w.url for w in ws],
                              "--balance-abs-threshold", "2",
                              "--balance-rel-threshold", "1.5",
                              "--disable-retries") as g:
            g.wait_ready(2)
            r = g.post("/v1/completions", body(" seed"))
            assert r.status == 200, r
            holder = r.headers["x-smg-routed-worker-id"]
            results = [None] * 6

            def one(i):
                rr = g.post("/v1/completions", body(f" held {i}", 4000),
                            timeout=30)
                results[i] = (rr.status,
                              rr.headers.get("x-smg-routed-worker-id"))
            threads = []
            for i in range(6):
                t = threading.Thread(target=one, args=(i,))
                t.start()
                threads.append(t)
                # Let the frontend count it in flight before the next one.
                time.sleep(0.3)
            for t in threads:
                t.join(30)
            assert all(s == 200 for s, _ in results), results
            assert [u for _, u in results[:5]] == [holder] * 5, results
            assert results[5][1] != holder, results
            assert metric(g, "smg_cache_aware_policy_branch_total",
                          branch="spill") == 1
            g.stop()
    finally:
        for w in ws:
            w.stop()


def test_labelled_cache_aware_model_gets_the_text(tmp_path):
    # --policy round_robin needs no routing text, so frontends skip it;
    # a model whose workers carry the label policy=cache_aware gets its
    # own cache_aware instance, which must still see the prompt.
    wa = [sim.start_simworker(tmp_path, "--model", "m-a", "--time-scale",
                              "0", name=f"a{i}") for i in range(3)]
    wb = sim.start_simworker(tmp_path, "--model", "m-b", "--time-scale", "0",
                             name="b")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", wb.url,
                              "--log-level", "debug") as g:
            for w in wa:
                r = g.post("/workers", {"url": w.url,
                                        "models": [{"id": "m-a"}],
                                        "labels": {"policy": "cache_aware"}})
                assert r.status == 202, r
            g.wait_ready(4)
            routed = []
            for i in range(20):
                b = body(f" question {i}?")
                b["model"] = "m-a"
                r = g.post("/v1/completions", b)
                assert r.status == 200, r
                routed.append(r.headers["x-smg-routed-worker-id"])
            assert len(set(routed)) == 1, routed
            matches = [float(m) for m in re.findall(
                r"cache_aware model m-a branch tree_match match (0\.\d+|1)",
                g.log())]
            assert len(matches) >= 19, matches
            assert min(matches[1:]) > 0.9, matches
            g.stop()
    finally:
        for w in wa + [wb]:
            w.stop()
