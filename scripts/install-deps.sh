#!/bin/sh
# Installs every Debian package smg-c needs to build, test and benchmark.
# Arguments name more packages to install with them (scripts/ci-checks.sh).
# Idempotent: does nothing (and prints nothing) when all are present.
set -eu

PACKAGES="build-essential cmake pkg-config clang-format valgrind \
libev-dev libnng-dev liblmdb-dev libhttp-parser-dev libmbedtls-dev \
libprotobuf-c-dev protobuf-c-compiler libcmocka-dev libzmq3-dev \
libmsgpack-dev libnghttp2-dev libcjson-dev libxxhash-dev \
python3 python3-pytest python3-zmq python3-msgpack \
wrk nginx-light haproxy curl openssl procps prometheus supervisor $*"

missing=""
for p in $PACKAGES; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
	    grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done
# node and npm run the OpenAI Node SDK test; optional (that test skips,
# saying why, without them), so they are tried apart and may fail.
node_missing=""
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1
then
	node_missing="nodejs npm"
fi
[ -z "$missing" ] && [ -z "$node_missing" ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [ -n "$missing" ]; then
	echo "install-deps: installing:$missing"
	# shellcheck disable=SC2086
	$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
if [ -n "$node_missing" ]; then
	echo "install-deps: installing: $node_missing (optional)"
	# shellcheck disable=SC2086
	$SUDO apt-get install -y -qq --no-install-recommends $node_missing \
	    >/dev/null || echo "install-deps: $node_missing not installed;" \
	    "the OpenAI Node SDK test will be skipped"
fi
