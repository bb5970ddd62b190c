#!/bin/sh
# Installs dependencies, builds (ASan+UBSan), and runs every test: cmocka
# unit tests and pytest system tests, all through ctest.
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
