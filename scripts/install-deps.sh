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
[ -z "$missing" ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-deps: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
