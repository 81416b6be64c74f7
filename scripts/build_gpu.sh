#!/usr/bin/env bash
# Builds the GPU binaries here (no GPU needed) and bundles them for the GPU machine:
#   build-gpu/  (CMake, Ninja, -DCOROLLA_CUDA=ON, sm_90a)  ->  gpu-bundle/{corolla,cuda_kernels_test}
# gpu-bundle/ is listed in .gitignore; carry it with the device call and run
# scripts/gpu_run.sh there. Third-party libraries other than CUDA/cuBLAS are linked statically.
# Usage: scripts/build_gpu.sh [extra cmake args]; COROLLA_JOBS (default 2) sets parallelism.
# COROLLA_BASE=PATH also bundles that (stripped) build of corolla as gpu-bundle/base_corolla, the
# same-call baseline of scripts/gpu_decode_ab.sh; COROLLA_PACK=1 packs gpu-bundle into
# mgpu-bundle/b.tar.xz (two builds and the test binary pass the 64 MiB a device call carries
# only packed; carry ["mgpu-bundle"]: gpu_run.sh and gpu_decode_ab.sh unpack it).
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
if [ -n "${COROLLA_BASE:-}" ]; then
  cp "$COROLLA_BASE" gpu-bundle/base_corolla
  strip gpu-bundle/base_corolla
else
  rm -f gpu-bundle/base_corolla  # no stale baseline from an earlier bundle
fi
ls -la gpu-bundle
if [ "${COROLLA_PACK:-0}" = 1 ]; then
  rm -rf mgpu-bundle && mkdir -p mgpu-bundle
  # xz -9's 64 MiB dictionary spans both builds of corolla: ~12.5 MB packed against ~27 at -6.
  XZ_OPT=${XZ_OPT:--9} tar cJf mgpu-bundle/b.tar.xz -C gpu-bundle .
  ls -la mgpu-bundle
fi
