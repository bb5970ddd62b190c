"""The official OpenAI Node SDK (npm `openai`) against the gateway,
unchanged: chat, completions, streaming with usage, the model list and
errors. The package is installed with npm into a cache directory
(SMG_NPM_CACHE, default ~/.cache/smg-c/npm) the first time; without
`node` and `npm` the test is skipped and says why.
"""
import json
import os
import shutil
import subprocess

import pytest

import gw
import sim
import util

SCRIPT = r"""
const mod = require(process.env.OPENAI_MODULE);
const OpenAI = mod.OpenAI || mod.default || mod;
const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1",
                            apiKey: "sk-test", maxRetries: 0 });
const out = {};
(async () => {
  const chat = await client.chat.completions.create({
    model: "sim-model", max_tokens: 4,
    messages: [{ role: "user", content: "Say hello" }] });
  out.chat = { object: chat.object, content: chat.choices[0].message.content,
               role: chat.choices[0].message.role,
               usage: chat.usage };
  const comp = await client.completions.create({
    model: "sim-model", prompt: "Once upon", max_tokens: 3 });
  out.completion = { object: comp.object, text: comp.choices[0].text,
                     usage: comp.usage };
  const stream = await client.chat.completions.create({
    model: "sim-model", max_tokens: 5, stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: "user", content: "Count" }] });
  let chunks = 0, text = "", usage = null;
  for await (const c of stream) {
    chunks++;
    if (c.choices.length > 0 && c.choices[0].delta.content)
      text += c.choices[0].delta.content;
    if (c.usage) usage = c.usage;
  }
  out.stream = { chunks, text, usage };
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  out.models = models;
  try {
    await client.chat.completions.create({ model: "no-such-model",
      messages: [{ role: "user", content: "x" }] });
    out.error = null;
  } catch (e) {
    out.error = { name: e.constructor.name, status: e.status, code: e.code,
                  message: e.message };
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def _openai_module():
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed to run the OpenAI Node SDK "
                    f"(node: {node}, npm: {npm})")
    cache = os.environ.get("SMG_NPM_CACHE") or os.path.expanduser(
        "~/.cache/smg-c/npm")
    module = os.path.join(cache, "node_modules", "openai")
    if not os.path.exists(os.path.join(module, "package.json")):
        os.makedirs(cache, exist_ok=True)
        r = subprocess.run([npm, "install", "--no-audit", "--no-fund",
                            "--prefix", cache, "openai"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.skip("npm could not install the openai package: "
                        + (r.stderr or r.stdout)[-500:])
    return node, module


def test_openai_node_sdk(tmp_path):
    node, module = _openai_module()
    script = tmp_path / "sdk.js"
    script.write_text(SCRIPT)
    w = sim.start_simworker(tmp_path, "--time-scale", "0")
    try:
        with gw.start_gateway(tmp_path, "--policy", "round_robin",
                              "--worker-urls", w.url) as g:
            g.wait_ready(1)
            env = dict(os.environ, OPENAI_MODULE=module,
                       BASE_URL=f"http://127.0.0.1:{g.port}")
            r = subprocess.run([node, str(script)], capture_output=True,
                               text=True, env=env,
                               timeout=60 * util.TIMEOUT_MULT)
            assert r.returncode == 0, r.stderr
            out = json.loads(r.stdout.strip().splitlines()[-1])
            g.stop()
    finally:
        w.stop()
    chat = out["chat"]
    assert chat["object"] == "chat.completion"
    assert chat["role"] == "assistant" and chat["content"]
    assert chat["usage"]["completion_tokens"] == 4
    comp = out["completion"]
    assert comp["object"] == "text_completion" and comp["text"]
    assert comp["usage"]["completion_tokens"] == 3
    st = out["stream"]
    assert st["chunks"] >= 2 and st["text"]
    assert st["usage"]["completion_tokens"] == 5
    assert st["usage"]["prompt_tokens"] > 0
    assert [m["id"] for m in out["models"]] == ["sim-model"]
    assert out["models"][0]["owned_by"] == "self_hosted"
    err = out["error"]
    assert err is not None and err["status"] == 404, err
    assert err["name"] == "NotFoundError", err
    assert err["code"] == "model_not_found", err
