#!/usr/bin/env bash
# Builds the GPU binaries here (no GPU needed) and bundles them for the GPU machine:
#   build-gpu/  (CMake, Ninja, -DCOROLLA_CUDA=ON, sm_90a)  ->  gpu-bundle/{corolla,cuda_kernels_test}
# gpu-bundle/ is listed in .git/info/exclude; carry it with the device call and run
# scripts/gpu_run.sh there. Third-party libraries other than CUDA/cuBLAS are linked statically.
# Usage: scripts/build_gpu.sh [extra cmake args]; COROLLA_JOBS (default 2) sets parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${COROLLA_GPU_BUILD_DIR:-build-gpu}
jobs=${COROLLA_JOBS:-2}
export PATH=/usr/local/cuda/bin:$PATH
if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOROLLA_CUDA=ON \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCOROLLA_STATIC_DEPS=ON "$@"
fi
targets=(cuda_kernels_test)
# The CLI needs the tokenizer; build it when it links, and say so when it does not.
if cmake --build "$build_dir" -j "$jobs" --target corolla; then
  targets+=(corolla)
else
  echo "build_gpu.sh: 'corolla' did not build; bundling the test binary only" >&2
fi
cmake --build "$build_dir" -j "$jobs" --target cuda_kernels_test

mkdir -p gpu-bundle
for t in "${targets[@]}"; do
  # The build's top level first (corolla lands there; an older layout left one in src/).
  src="$build_dir/$t"
  [ -x "$src" ] || src=$(find "$build_dir" -name "$t" -type f -perm -u+x | head -1)
  cp "$src" "gpu-bundle/$t"
  strip "gpu-bundle/$t"
done
echo "== shared libraries the bundle needs (the GPU machine has CUDA/cuBLAS, openblas, pcre2, gomp):"
for t in "${targets[@]}"; do
  echo "-- $t"
  ldd "gpu-bundle/$t" | awk '{print "   " $1}' | grep -v -E 'linux-vdso|ld-linux' || true
done
ls -la gpu-bundle
