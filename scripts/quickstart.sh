#!/bin/sh
# Quick start: installs dependencies, builds, starts two simulated workers
# on 127.0.0.1:8001 and :8002, and runs the gateway in the foreground on
# :30000 (metrics on :29000). Ctrl-C stops everything.
# The policy is SMG's default, cache_aware; extra arguments go to smg, e.g.
# ./scripts/quickstart.sh --policy round_robin
# Environment: SMG_PORT, SMG_METRICS_PORT, SMG_WORKER_PORTS ("8001 8002"),
# SMG_BUILD_DIR (build) override the defaults.
set -eu
cd "$(dirname "$0")/.."
build=${SMG_BUILD_DIR:-build}
port=${SMG_PORT:-30000}
metrics_port=${SMG_METRICS_PORT:-29000}
worker_ports=${SMG_WORKER_PORTS:-8001 8002}

./scripts/install-deps.sh
if [ "$build" = build ]; then
	./scripts/build.sh >/dev/null
fi

run=$(mktemp -d "${TMPDIR:-/tmp}/smg-quickstart.XXXXXX")
pids=""
cleanup() {
	# shellcheck disable=SC2086
	[ -n "$pids" ] && kill $pids 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$run"
}
trap cleanup EXIT INT TERM

urls=""
for wp in $worker_ports; do
	"$build/smg-simworker" --port "$wp" --model sim-model \
	    --worker-id "sim-$wp" 2>"$run/sim-$wp.log" &
	pids="$pids $!"
	urls="$urls http://127.0.0.1:$wp"
done

echo "quickstart: workers:$urls; gateway on http://127.0.0.1:$port"
echo "quickstart: try: curl -s localhost:$port/v1/chat/completions -H 'content-type: application/json' -d '{\"model\":\"sim-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}'"
# shellcheck disable=SC2086
"$build/smg" --worker-urls $urls \
    --port "$port" --prometheus-port "$metrics_port" \
    --run-dir "$run/run" --state-dir "$run/state" "$@" &
smg_pid=$!
# The gateway stops on SIGINT/SIGTERM; forward ours to it and wait.
trap 'kill -TERM $smg_pid 2>/dev/null' INT TERM
set +e
wait $smg_pid
status=$?
# A signal interrupted wait: let the gateway finish its shutdown.
while [ $status -gt 128 ] && kill -0 $smg_pid 2>/dev/null; do
	wait $smg_pid
	status=$?
done
trap - INT TERM
exit $status
