#!/bin/sh
# Configures (once) and builds smg-c into build/ (Debug: ASan+UBSan) or,
# with BUILD_TYPE=Release, into build-release/.
set -eu
cd "$(dirname "$0")/.."
type=${BUILD_TYPE:-Debug}
dir=build
[ "$type" = Release ] && dir=build-release
if [ ! -f "$dir/CMakeCache.txt" ]; then
	cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" >/dev/null
fi
cmake --build "$dir" -j "$(nproc)" -- --no-print-directory
