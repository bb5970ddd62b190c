"""cache_aware hash mode (policies.md §11.7): its placements are written
behind to the state dir like the trees, so after a restart of the whole
service a prefix seen before goes where it went (hash_hit), not to a
fresh fallback pick."""
import re

import gw
import sim

MODEL = "sim-model"


def gen(ids):
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}


def routed(g, ids):
    r = g.post("/generate", gen(ids))
    assert r.status == 200, r
    return r.headers["x-smg-routed-worker-id"]


def test_hash_placements_survive_restart(tmp_path):
    ws = [sim.start_simworker(tmp_path, "--model", MODEL, "--time-scale", "0")
          for _ in range(3)]
    args = ["--policy", "cache_aware", "--cache-index", "hash",
            "--cache-boundaries", "32,64", "--log-level", "debug",
            "--worker-urls", *[w.url for w in ws]]
    prompts = [list(range(1000 * i, 1000 * i + 80)) for i in range(1, 10)]
    try:
        with gw.start_gateway(tmp_path, *args) as g:
            g.wait_ready(3)
            before = [routed(g, p) for p in prompts]
            assert len(set(before)) > 1, before
            # Seen again: each goes where it went.
            assert [routed(g, p + [7]) for p in prompts] == before
            g.stop()
        with gw.start_gateway(tmp_path, *args) as g:
            g.wait_ready(3)
            after = [routed(g, p + [9]) for p in prompts]
            assert after == before, (before, after)
            # Two boundaries per prompt: 18 placements came back.
            restored = re.findall(r"persist_restore: (\d+) assignments",
                                  g.log())
            assert restored and int(restored[-1]) >= 2 * len(prompts), \
                restored
            hits = re.findall(r"branch hash_hit", g.log())
            assert len(hits) >= len(prompts), g.log()[-3000:]
            g.stop()
    finally:
        for w in ws:
            w.stop()
