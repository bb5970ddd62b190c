"""SMG's command line starts smg-c: every flag of SMG's CLI (its
model_gateway/src/main.rs CliArgs, plus the hand-parsed --prefill/--encode
and --version-verbose) is accepted with a valid value; flags smg-c does not
use print one warning line each; an absent subsystem's routes answer 501
naming it; unimplemented authentication never serves open."""
import subprocess

import pytest

import gw
import util

W = "http://127.0.0.1:1"
PD = ["--pd-disaggregation", "--prefill", W, "--decode", "http://127.0.0.1:2"]
EPD = ["--epd-disaggregation", "--encode", "http://127.0.0.1:3",
       "--prefill", W, "--decode", "http://127.0.0.1:2"]

# SMG flag -> a command line giving it a valid value (the flag first).
SMG_FLAGS = {
    "host": ["--host", "127.0.0.1"],
    "port": ["--port", "31000"],
    "health-check-port": ["--health-check-port", "31001"],
    "worker-urls": ["--worker-urls", W, "http://127.0.0.1:2"],
    "policy": ["--policy", "round_robin"],
    "cache-threshold": ["--cache-threshold", "0.5"],
    "balance-abs-threshold": ["--balance-abs-threshold", "32"],
    "balance-rel-threshold": ["--balance-rel-threshold", "1.2"],
    "balance-token-usage-threshold": ["--balance-token-usage-threshold", "0.8"],
    "overload-token-usage-threshold": ["--overload-token-usage-threshold",
                                       "0.9"],
    "eviction-interval": ["--eviction-interval", "60"],
    "max-tree-size": ["--max-tree-size", "1000000"],
    "block-size": ["--block-size", "32"],
    "max-idle-secs": ["--max-idle-secs", "600"],
    "assignment-mode": ["--policy", "manual", "--assignment-mode", "min_load"],
    "prefix-token-count": ["--prefix-token-count", "128"],
    "prefix-hash-load-factor": ["--prefix-hash-load-factor", "1.5"],
    "least-load-kv-pressure-weight": ["--least-load-kv-pressure-weight", "0.2"],
    "least-load-default-throughput": ["--least-load-default-throughput",
                                      "1000"],
    "least-load-mean-prefill-tokens": ["--least-load-mean-prefill-tokens",
                                       "512"],
    "dp-aware": ["--dp-aware"],
    "routing-key-override": ["--routing-key-override"],
    "enable-igw": ["--enable-igw"],
    "dp-minimum-tokens-scheduler": ["--dp-minimum-tokens-scheduler"],
    "pd-disaggregation": PD,
    "epd-disaggregation": EPD,
    "prefill": PD,
    "encode": EPD,
    "decode": PD,
    "prefill-policy": PD + ["--prefill-policy", "random"],
    "decode-policy": PD + ["--decode-policy", "round_robin"],
    "encode-policy": EPD + ["--encode-policy", "random"],
    "worker-startup-timeout-secs": ["--worker-startup-timeout-secs", "60"],
    "worker-startup-delay": ["--worker-startup-delay", "1"],
    "worker-startup-check-interval": ["--worker-startup-check-interval", "5"],
    "load-monitor-interval": ["--load-monitor-interval", "5"],
    "engine-metrics": ["--engine-metrics"],
    "multimodal-tensor-transport": ["--multimodal-tensor-transport", "shm"],
    "multimodal-shm-min-bytes": ["--multimodal-shm-min-bytes", "4096"],
    "service-discovery": ["--service-discovery", "--selector", "app=sglang"],
    "selector": ["--selector", "app=sglang"],
    "service-discovery-port": ["--service-discovery-port", "8000"],
    "service-discovery-namespace": ["--service-discovery-namespace", "llm"],
    "encode-selector": ["--encode-selector", "role=encode"],
    "prefill-selector": ["--prefill-selector", "role=prefill"],
    "decode-selector": ["--decode-selector", "role=decode"],
    "router-selector": ["--router-selector", "app=smg"],
    "model-id-from": ["--model-id-from", "label:model"],
    "model-alias": ["--model-alias", "gpt=llama"],
    "log-dir": ["--log-dir", "LOGDIR"],
    "log-level": ["--log-level", "debug"],
    "log-json": ["--log-json"],
    "prometheus-port": ["--prometheus-port", "31002"],
    "prometheus-host": ["--prometheus-host", "127.0.0.1"],
    "prometheus-duration-buckets": ["--prometheus-duration-buckets", "0.1",
                                    "1", "10"],
    "request-id-headers": ["--request-id-headers", "x-req-id"],
    "storage-context-headers": ["--storage-context-headers", "x-user"],
    "trust-tenant-header": ["--trust-tenant-header"],
    "tenant-header-name": ["--tenant-header-name", "x-tenant"],
    "request-timeout-secs": ["--request-timeout-secs", "60"],
    "shutdown-grace-period-secs": ["--shutdown-grace-period-secs", "5"],
    "max-payload-size": ["--max-payload-size", "1048576"],
    "cors-allowed-origins": ["--cors-allowed-origins", "https://a.example"],
    "max-concurrent-requests": ["--max-concurrent-requests", "8"],
    "queue-size": ["--queue-size", "4"],
    "queue-timeout-secs": ["--queue-timeout-secs", "2"],
    "priority-scheduler-enabled": ["--priority-scheduler-enabled"],
    "priority-scheduler-default-max-class": [
        "--priority-scheduler-default-max-class", "default"],
    "priority-scheduler-config": ["--priority-scheduler-config", "p.yaml"],
    "priority-scheduler-tenant-metric-top-n": [
        "--priority-scheduler-tenant-metric-top-n", "8"],
    "tenant-rate-limit-enabled": ["--tenant-rate-limit-enabled",
                                  "--tenant-rate-limit-config", "t.yaml"],
    "tenant-rate-limit-config": ["--tenant-rate-limit-config", "t.yaml"],
    "rate-limit-tokens-per-second": ["--max-concurrent-requests", "4",
                                     "--rate-limit-tokens-per-second", "10"],
    "retry-max-retries": ["--retry-max-retries", "3"],
    "retry-initial-backoff-ms": ["--retry-initial-backoff-ms", "10"],
    "retry-max-backoff-ms": ["--retry-max-backoff-ms", "1000"],
    "retry-backoff-multiplier": ["--retry-backoff-multiplier", "2"],
    "retry-jitter-factor": ["--retry-jitter-factor", "0.1"],
    "disable-retries": ["--disable-retries"],
    "cb-failure-threshold": ["--cb-failure-threshold", "3"],
    "cb-success-threshold": ["--cb-success-threshold", "2"],
    "cb-timeout-duration-secs": ["--cb-timeout-duration-secs", "10"],
    "cb-window-duration-secs": ["--cb-window-duration-secs", "30"],
    "disable-circuit-breaker": ["--disable-circuit-breaker"],
    "health-failure-threshold": ["--health-failure-threshold", "2"],
    "health-success-threshold": ["--health-success-threshold", "1"],
    "health-check-timeout-secs": ["--health-check-timeout-secs", "2"],
    "health-check-interval-secs": ["--health-check-interval-secs", "10"],
    "health-check-endpoint": ["--health-check-endpoint", "/healthz"],
    "disable-health-check": ["--disable-health-check"],
    "remove-unhealthy-workers": ["--remove-unhealthy-workers"],
    "drain-settle-secs": ["--drain-settle-secs", "1"],
    "model-path": ["--model-path", "meta-llama/Llama-3.1-8B"],
    "tokenizer-path": ["--tokenizer-path", "/models/tok"],
    "chat-template": ["--chat-template", "/models/t.jinja"],
    "disable-tokenizer-autoload": ["--disable-tokenizer-autoload"],
    "tokenizer-cache-enable-l0": ["--tokenizer-cache-enable-l0"],
    "tokenizer-cache-l0-max-entries": ["--tokenizer-cache-l0-max-entries",
                                       "100"],
    "tokenizer-cache-enable-l1": ["--tokenizer-cache-enable-l1"],
    "tokenizer-cache-l1-max-memory": ["--tokenizer-cache-l1-max-memory",
                                      "1048576"],
    "reasoning-parser": ["--reasoning-parser", "deepseek-r1"],
    "tool-call-parser": ["--tool-call-parser", "llama"],
    "mcp-config-path": ["--mcp-config-path", "mcp.yaml"],
    "backend": ["--backend", "vllm"],
    "history-backend": ["--history-backend", "postgres"],
    "enable-wasm": ["--enable-wasm"],
    "storage-hook-wasm-path": ["--storage-hook-wasm-path", "h.wasm"],
    "schema-config": ["--schema-config", "s.yaml"],
    "oracle-wallet-path": ["--oracle-wallet-path", "/w"],
    "oracle-tns-alias": ["--oracle-tns-alias", "db_high"],
    "oracle-dsn": ["--oracle-dsn", "host/svc"],
    "oracle-user": ["--oracle-user", "admin"],
    "oracle-password": ["--oracle-password", "pw"],
    "oracle-external-auth": ["--oracle-external-auth"],
    "oracle-pool-min": ["--oracle-pool-min", "1"],
    "oracle-pool-max": ["--oracle-pool-max", "4"],
    "oracle-pool-timeout-secs": ["--oracle-pool-timeout-secs", "30"],
    "postgres-db-url": ["--postgres-db-url", "postgres://u@h/db"],
    "postgres-pool-max-size": ["--postgres-pool-max-size", "8"],
    "redis-url": ["--redis-url", "redis://127.0.0.1:6379"],
    "redis-pool-max-size": ["--redis-pool-max-size", "8"],
    "redis-retention-days": ["--redis-retention-days", "30"],
    "tls-cert-path": ["--tls-cert-path", "CERT", "--tls-key-path", "KEY"],
    "tls-key-path": ["--tls-cert-path", "CERT", "--tls-key-path", "KEY"],
    "enable-trace": ["--enable-trace"],
    "otlp-traces-endpoint": ["--otlp-traces-endpoint", "localhost:4317"],
    "api-key": ["--api-key", "secret"],
    "tenant-api-key": ["--tenant-api-key", "acme:k1"],
    # Issuer and audience go together (docs/decisions.md).
    "jwt-issuer": ["--jwt-issuer", "https://idp.example",
                   "--jwt-audience", "smg"],
    "jwt-audience": ["--jwt-audience", "smg",
                     "--jwt-issuer", "https://idp.example"],
    "jwt-jwks-uri": ["--jwt-jwks-uri", "https://idp.example/jwks",
                     "--jwt-issuer", "https://idp.example",
                     "--jwt-audience", "smg"],
    "jwt-role-claim": ["--jwt-role-claim", "groups"],
    "jwt-role-mapping": ["--jwt-role-mapping", "ops=admin"],
    "control-plane-api-keys": ["--control-plane-api-keys", "k1:ops:admin:s3"],
    "disable-audit-logging": ["--disable-audit-logging"],
    "enable-mesh": ["--enable-mesh"],
    "mesh-server-name": ["--mesh-server-name", "gw-a"],
    "mesh-host": ["--mesh-host", "0.0.0.0"],
    "mesh-advertise-host": ["--mesh-advertise-host", "10.0.0.1"],
    "mesh-port": ["--mesh-port", "39527"],
    "mesh-peer-urls": ["--mesh-peer-urls", "10.0.0.2:39527"],
    "webrtc-bind-addr": ["--webrtc-bind-addr", "0.0.0.0"],
    "webrtc-stun-server": ["--webrtc-stun-server", "stun.l.google.com:19302"],
    "runtime-worker-threads": ["--runtime-worker-threads", "4"],
}

# Flags smg-c accepts without effect: one warning line each.
WARNED = {
    "multimodal-tensor-transport", "multimodal-shm-min-bytes",
    "router-selector",
    "storage-context-headers", "priority-scheduler-enabled",
    "priority-scheduler-default-max-class", "priority-scheduler-config",
    "priority-scheduler-tenant-metric-top-n", "chat-template",
    "disable-tokenizer-autoload", "tokenizer-cache-enable-l0",
    "tokenizer-cache-l0-max-entries", "tokenizer-cache-enable-l1",
    "tokenizer-cache-l1-max-memory", "reasoning-parser", "tool-call-parser",
    "mcp-config-path", "history-backend", "enable-wasm",
    "storage-hook-wasm-path", "schema-config", "oracle-wallet-path",
    "oracle-tns-alias", "oracle-dsn", "oracle-user", "oracle-password",
    "oracle-external-auth", "oracle-pool-min", "oracle-pool-max",
    "oracle-pool-timeout-secs", "postgres-db-url", "postgres-pool-max-size",
    "redis-url", "redis-pool-max-size", "redis-retention-days",
    "enable-mesh",
    "mesh-server-name", "mesh-host", "mesh-advertise-host", "mesh-port",
    "mesh-peer-urls", "webrtc-bind-addr", "webrtc-stun-server",
    "runtime-worker-threads",
}


def run_smg(*args, timeout=20):
    argv = [util.binary("smg")] + [str(a) for a in args]
    return subprocess.run(argv, capture_output=True, text=True,
                          timeout=timeout * util.TIMEOUT_MULT,
                          start_new_session=True)


def fill(args, tmp_path):
    out = []
    for a in args:
        if a == "LOGDIR":
            a = str(tmp_path / "logs")
        elif a in ("CERT", "KEY"):
            a = str(tmp_path / a.lower())
            open(a, "w").close()
        out.append(a)
    return out


def base_for(args):
    pd = "--pd-disaggregation" in args or "--epd-disaggregation" in args
    return [] if pd or "--worker-urls" in args else ["--worker-urls", W]


@pytest.mark.parametrize("flag", sorted(SMG_FLAGS))
def test_every_smg_flag_starts(tmp_path, flag):
    args = fill(SMG_FLAGS[flag], tmp_path)
    assert f"--{flag}" in args
    r = run_smg(*base_for(args), *args, "--run-dir", tmp_path / "run", "-n")
    assert r.returncode == 0, (flag, r.stderr)
    assert "configuration OK" in r.stdout
    warns = [ln for ln in r.stderr.splitlines() if "warning:" in ln]
    if flag in ("selector", "prefill-selector", "decode-selector",
                "encode-selector", "service-discovery-namespace",
                "model-id-from"):
        assert len(warns) == 1 and "without --service-discovery" in \
            warns[0], r.stderr
    elif flag in WARNED:
        assert len(warns) == 1, r.stderr
        assert f"--{flag}: accepted" in warns[0]
    else:
        assert warns == [], r.stderr


def test_version_verbose(tmp_path):
    r = run_smg("--version-verbose")
    assert r.returncode == 0 and r.stdout.startswith("smg-c "), r


@pytest.mark.parametrize("args", [
    ["--webrtc-bind-addr", "not-an-ip"],
    ["--tenant-api-key", "nocolon"],
    ["--history-backend", "mongo"],
    ["--mesh-port", "70000"],
    ["--model-id-from", "label:"],
    ["--multimodal-tensor-transport", "carrier-pigeon"],
    ["--service-discovery"],
    ["--service-discovery-namespace", "Not_A_Label"],
])
def test_invalid_values_still_refused(tmp_path, args):
    r = run_smg("--worker-urls", W, *args, "-n")
    assert r.returncode == 2, r
    assert args[0] in r.stderr


def test_real_start_with_many_smg_flags(tmp_path):
    """One live gateway started with most accepted-only flags: it serves,
    each flag is warned about once, absent subsystems answer 501."""
    extra = []
    for flag in sorted(WARNED):
        extra += fill(SMG_FLAGS[flag], tmp_path)
    g = gw.start_gateway(tmp_path, "--policy", "round_robin",
                         "--worker-urls", W, *extra)
    try:
        assert g.get("/health").status == 200
        r = g.get("/v1/responses/resp_1")
        assert r.status == 501, r
        assert "response storage" in r.json()["error"]["message"]
        r = g.post("/v1/conversations", {})
        assert r.status == 501 and "response storage" in r.body.decode()
        r = g.post("/v1/tokenize", {"model": "m", "prompt": "x"})
        assert r.status == 501 and "tokeniz" in r.body.decode()
        r = g.get("/wasm")
        assert r.status == 501 and "WASM" in r.body.decode()
        log = g.log()
        for flag in ("chat-template", "redis-url", "enable-mesh",
                     "enable-wasm"):
            assert log.count(f"--{flag}: accepted") == 1, flag
    finally:
        g.stop()
