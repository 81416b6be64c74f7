#!/usr/bin/env bash
# One command for everything CI checks: installs what is missing, fetches the pinned tokenizers,
# builds (CPU backend; with nvcc present the CUDA sources are compiled too) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_tokenizers.sh
scripts/build.sh
ctest --test-dir "${COROLLA_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600
