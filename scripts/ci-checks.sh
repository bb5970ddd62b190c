#!/bin/sh
# The checks STYLE.md promises beyond the test suite, each timed:
#   format  clang-format --dry-run -Werror over every tracked .c/.h
#   fuzz    the HTTP reader's libFuzzer target (shared/http_fuzz.c) with
#           ASan+UBSan, FUZZ_RUNS inputs (default 200000) from the seed
#           corpus tests/fuzz/http, fixed seed
#   tsan    a ThreadSanitizer build (clang, build-tsan/): the frontend's
#           unit tests and tests/system/test_datapath.py
#   clang   a clang build of everything with -Werror (build-clang/)
#   units   the systemd units as `cmake --install` ships them (Release build
#           in build-release/, installed into a scratch root):
#           `systemd-analyze verify` must print nothing (an unknown or
#           misspelt directive is only a warning there) and
#           `systemd-analyze security --offline` must rate each unit at
#           most SMG_UNIT_EXPOSURE (tenths: default 20 = 2.0); skipped,
#           with the reason printed, when systemd-analyze (Debian package
#           systemd) is absent
#   calls   no two .c files of a process call each other in circles
#           (scripts/callgraph.py over the objects of build/)
# Usage: scripts/ci-checks.sh [step...]   (all six by default)
# Installs what it needs (clang, libFuzzer's runtime) with apt-get like
# scripts/install-deps.sh. Build dirs are kept for the next run.
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh clang libclang-rt-14-dev

jobs=$(nproc)
steps=${*:-format calls fuzz tsan clang units}
summary=""

step_format() {
	git ls-files -z -- '*.c' '*.h' | xargs -0 clang-format --dry-run -Werror
}

step_calls() {
	[ -d build/frontend ] || ./scripts/build.sh >/dev/null
	python3 scripts/callgraph.py build frontend broker poller >/dev/null ||
	    { python3 scripts/callgraph.py build frontend broker poller |
	        grep CYCLE; return 1; }
}

step_fuzz() {
	d=build-fuzz
	mkdir -p "$d"
	rm -rf "$d/corpus"
	mkdir "$d/corpus"
	# shellcheck disable=SC2046
	clang -g -O1 -fsanitize=fuzzer,address,undefined \
	    -fno-sanitize-recover=undefined -I. \
	    $(pkg-config --cflags libcjson) shared/http_fuzz.c shared/http.c \
	    -lhttp_parser $(pkg-config --libs libcjson) -o "$d/http_fuzz"
	# New inputs go to the scratch corpus, never into the seeds.
	"$d/http_fuzz" -runs="${FUZZ_RUNS:-200000}" -seed=1 -max_len=8192 \
	    -print_final_stats=1 "$d/corpus" tests/fuzz/http 2>"$d/fuzz.log" ||
	    { tail -60 "$d/fuzz.log"; return 1; }
	grep -E "stat::number_of_executed_units|Done " "$d/fuzz.log" || true
}

step_tsan() {
	d=build-tsan
	[ -f "$d/CMakeCache.txt" ] ||
	    cmake -S . -B "$d" -DCMAKE_C_COMPILER=clang \
	    -DCMAKE_BUILD_TYPE=Debug -DSANITIZER=thread >/dev/null
	units=$(for f in frontend/*_test.c; do basename "$f" .c; done)
	# shellcheck disable=SC2086
	cmake --build "$d" -j "$jobs" --target smg smg-frontend smg-broker \
	    smg-poller smg-simworker $units -- --no-print-directory >/dev/null
	re=$(echo $units | sed 's/ /|/g')
	(cd "$d" && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	    ctest --output-on-failure -R "^($re)\$" -j "$jobs")
	(cd tests/system && SMG_BUILD_DIR="$PWD/../../$d" \
	    TSAN_OPTIONS="second_deadlock_stack=1" TEST_TIMEOUT_MULT=3 \
	    /usr/bin/python3 -m pytest -q -p no:cacheprovider test_datapath.py)
}

step_clang() {
	d=build-clang
	[ -f "$d/CMakeCache.txt" ] ||
	    cmake -S . -B "$d" -DCMAKE_C_COMPILER=clang \
	    -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build "$d" -j "$jobs" -- --no-print-directory >/dev/null
}

step_units() {
	if ! command -v systemd-analyze >/dev/null 2>&1; then
		echo "units: skipped: systemd-analyze not found (Debian package systemd)"
		return 0
	fi
	BUILD_TYPE=Release ./scripts/build.sh >/dev/null
	root=$(mktemp -d)
	# The host's own units (sysinit.target...) resolve the dependencies.
	mkdir -p "$root/usr/lib/systemd" "$root/etc/smg"
	cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
	DESTDIR=$root cmake --install build-release >/dev/null
	cp "$root/usr/local/share/smg-c/smg.env" "$root/etc/smg/smg.env"
	units="smg-broker.service smg-poller.service smg-frontend@0.service"
	# shellcheck disable=SC2086
	out=$(systemd-analyze verify --root="$root" $units smg.target 2>&1) ||
	    { echo "$out"; rm -rf "$root"; return 1; }
	if [ -n "$out" ]; then
		echo "$out"
		rm -rf "$root"
		return 1
	fi
	for u in $units; do
		out=$(systemd-analyze security --offline=yes --root="$root" \
		    --threshold="${SMG_UNIT_EXPOSURE:-20}" "$u" 2>&1) ||
		    { echo "$out"; rm -rf "$root"; return 1; }
		echo "$out" | grep "Overall exposure"
	done
	rm -rf "$root"
}

for s in $steps; do
	case $s in
	format | calls | fuzz | tsan | clang | units) ;;
	*) echo "ci-checks: unknown step $s" >&2; exit 2 ;;
	esac
	echo "== $s"
	t0=$(date +%s)
	"step_$s"
	t1=$(date +%s)
	echo "== $s: ok ($((t1 - t0)) s)"
	summary="$summary $s=$((t1 - t0))s"
done
echo "ci-checks: ok:$summary"
