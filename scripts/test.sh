#!/usr/bin/env bash
# One command for everything CI checks: installs what is missing, fetches the pinned tokenizers,
# builds the CPU build and runs every test; then, where the CUDA toolkit is present, compiles
# the CUDA backend and its GPU tests too (they run on a GPU machine: scripts/gpu_run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_tokenizers.sh
scripts/build.sh
ctest --test-dir "${COROLLA_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600

nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc" ] && [ "${COROLLA_SKIP_CUDA:-0}" != 1 ]; then
  echo "test.sh: compiling the CUDA backend with $nvcc (build-cuda/)"
  if [ ! -f build-cuda/build.ninja ]; then
    cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOROLLA_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90a
  fi
  cmake --build build-cuda -j "${COROLLA_JOBS:-$(nproc)}" --target corolla cuda_kernels_test
else
  echo "test.sh: no CUDA toolkit found; the CUDA backend was not compiled"
fi
