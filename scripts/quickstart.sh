#!/bin/sh
# Quick start: installs dependencies, builds, starts two simulated workers
# on 127.0.0.1:8001 and :8002, and runs the gateway in the foreground on
# :30000 (metrics on :29000). Ctrl-C stops everything.
# Extra arguments are passed to smg, e.g. ./scripts/quickstart.sh --policy random
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh >/dev/null

run=$(mktemp -d "${TMPDIR:-/tmp}/smg-quickstart.XXXXXX")
pids=""
cleanup() {
	# shellcheck disable=SC2086
	[ -n "$pids" ] && kill $pids 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$run"
}
trap cleanup EXIT INT TERM

for port in 8001 8002; do
	./build/smg-simworker --port "$port" --model sim-model \
	    --worker-id "sim-$port" 2>"$run/sim-$port.log" &
	pids="$pids $!"
done

echo "quickstart: workers on :8001 and :8002; gateway on http://127.0.0.1:30000"
echo "quickstart: try: curl -s localhost:30000/v1/chat/completions -H 'content-type: application/json' -d '{\"model\":\"sim-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}'"
./build/smg --policy round_robin \
    --worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 \
    --run-dir "$run/run" --state-dir "$run/state" "$@"
