#!/bin/sh
# The container recipe's steps, runnable with or without a container engine
# (deploy/container/Containerfile runs them; CI runs them in a clean
# directory with `ci`, where no image can be pulled).
#
#   build.sh build SRC DESTDIR   install the build packages (apt-get), build
#                                SRC as Release in SRC/build-release and
#                                install it under DESTDIR with prefix
#                                /usr/local, plus the list of Debian packages
#                                the binaries need at run time
#                                (DESTDIR/usr/local/share/smg-c/runtime-packages)
#   build.sh runtime DESTDIR     install those runtime packages (apt-get)
#   build.sh check DESTDIR       run the installed smg: --check-config, then a
#                                short start (liveness answers, SIGTERM, exit 0)
#   build.sh ci                  copy the tracked sources of this checkout to a
#                                fresh temp dir, then build, runtime and check
#                                there; the temp dir is removed
set -eu

prefix=/usr/local
here=$(cd "$(dirname "$0")" && pwd)

apt_install() {
	missing=""
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
		    grep -q "install ok installed" || missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	sudo=""
	[ "$(id -u)" -ne 0 ] && sudo="sudo"
	echo "container: installing:$missing"
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq
	# shellcheck disable=SC2086
	$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# The Debian package owning each shared library the binaries load.
runtime_packages() {
	for b in "$@"; do
		ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
	done | sort -u | while read -r lib; do
		real=$(readlink -f "$lib")
		for p in "$lib" "$real" "${real#/usr}" "${lib#/usr}"; do
			if owner=$(dpkg-query -S "$p" 2>/dev/null); then
				echo "${owner%%:*}"
				break
			fi
		done
	done | sort -u
}

step_build() {
	src=$1 dest=$2
	apt_install build-essential cmake pkg-config libev-dev libnng-dev \
	    liblmdb-dev libhttp-parser-dev libmbedtls-dev libprotobuf-c-dev \
	    protobuf-c-compiler libcmocka-dev libzmq3-dev libmsgpack-dev \
	    libnghttp2-dev libcjson-dev libxxhash-dev
	cmake -S "$src" -B "$src/build-release" -DCMAKE_BUILD_TYPE=Release \
	    -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
	cmake --build "$src/build-release" -j "$(nproc)" --target smg \
	    smg-broker smg-poller smg-frontend -- --no-print-directory >/dev/null
	DESTDIR="$dest" cmake --install "$src/build-release" >/dev/null
	runtime_packages "$dest$prefix/bin/smg" "$dest$prefix/bin/smg-broker" \
	    "$dest$prefix/bin/smg-poller" "$dest$prefix/bin/smg-frontend" \
	    >"$dest$prefix/share/smg-c/runtime-packages"
	echo "container: installed into $dest$prefix:"
	(cd "$dest" && find . -type f | sort | sed 's/^\./  /')
}

step_runtime() {
	# shellcheck disable=SC2046
	apt_install $(cat "$1$prefix/share/smg-c/runtime-packages")
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

step_check() {
	dest=$1
	bin=$dest$prefix/bin
	tmp=$(mktemp -d)
	port=$(free_port)
	mport=$(free_port)
	set -- --host 127.0.0.1 --port "$port" --prometheus-host 127.0.0.1 \
	    --prometheus-port "$mport" --run-dir "$tmp/run" \
	    --state-dir "$tmp/state" --frontends 2 --policy round_robin \
	    --worker-urls http://127.0.0.1:9 --shutdown-grace-period-secs 5
	"$bin/smg" --check-config "$@"
	"$bin/smg" "$@" >"$tmp/smg.log" 2>&1 &
	pid=$!
	ok=""
	for _ in $(seq 100); do
		if curl -fsS "http://127.0.0.1:$port/liveness" >/dev/null 2>&1; then
			ok=1
			break
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if [ -z "$ok" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" || true
		cat "$tmp/smg.log"
		rm -rf "$tmp"
		echo "container: the installed smg did not serve" >&2
		return 1
	fi
	curl -fsS "http://127.0.0.1:$mport/metrics" | grep -q '^smg_' || {
		kill "$pid"; wait "$pid" || true; rm -rf "$tmp"
		echo "container: no smg_ series on /metrics" >&2; return 1; }
	kill -TERM "$pid"
	rc=0
	wait "$pid" || rc=$?
	if [ "$rc" -ne 0 ] || [ -e "$tmp/run" ]; then
		cat "$tmp/smg.log"
		rm -rf "$tmp"
		echo "container: smg exited $rc or left its run dir" >&2
		return 1
	fi
	rm -rf "$tmp"
	echo "container: installed smg served on :$port and stopped cleanly"
}

step_ci() {
	root=$(cd "$here/../.." && pwd)
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	mkdir "$work/src" "$work/dest"
	# Tracked files only, as a clean clone has them (work tree contents).
	(cd "$root" && git ls-files -z | xargs -0 tar cf -) |
	    (cd "$work/src" && tar xf -)
	step_build "$work/src" "$work/dest"
	step_runtime "$work/dest"
	step_check "$work/dest"
}

case ${1:-} in
build) [ $# -eq 3 ] || { echo "usage: $0 build SRC DESTDIR" >&2; exit 2; }
	step_build "$2" "$3" ;;
runtime) [ $# -eq 2 ] || { echo "usage: $0 runtime DESTDIR" >&2; exit 2; }
	step_runtime "$2" ;;
check) [ $# -eq 2 ] || { echo "usage: $0 check DESTDIR" >&2; exit 2; }
	step_check "$2" ;;
ci) step_ci ;;
*) echo "usage: $0 build SRC DESTDIR | runtime DESTDIR | check DESTDIR | ci" >&2
	exit 2 ;;
esac
