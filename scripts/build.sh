#!/usr/bin/env bash
# Configures and builds the CPU build in build/ (Ninja, ccache). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${COROLLA_BUILD_DIR:-build}
if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$build_dir" -j "${COROLLA_JOBS:-$(nproc)}"
