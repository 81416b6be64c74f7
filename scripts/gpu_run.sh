#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, from the repository root, with gpu-bundle/
# carried): prints the GPU, runs the CUDA kernel/model tests and benchmarks from
# gpu-bundle/cuda_kernels_test with logs under $OUT, and ends with a short summary.
# Build the bundle here first with scripts/build_gpu.sh. Env: COROLLA_GTEST_FILTER (default *);
# COROLLA_BENCH=1 also runs `corolla bench decode|prefill` on Qwen3-30B-A3B random weights
# (COROLLA_BENCH_LAYERS: depth, default all 48; logs $OUT/bench_*.log); COROLLA_SKIP_TESTS=1 skips the tests.
# COROLLA_BENCH_DECODE="CONFIG:LAYERS ..." adds `bench decode` of each config (random weights,
# truncated to LAYERS) at COROLLA_BENCH_BATCHES, e.g. tests/data/configs/deepseek-v3.json:5;
# COROLLA_BENCH_DECODE_ARGS adds flags to those runs (e.g. --breakdown).
# COROLLA_BENCH_QWEN3=0 skips the Qwen3-30B-A3B decode/prefill benches; COROLLA_BENCH_QWEN3_ARGS adds
# flags to its decode bench (e.g. --marginal; environment knobs such as COROLLA_STAGED_ROUTER=1 pass
# through as they are; COROLLA_TIMELINE=3000 prints a kernel timeline of one eager step:
# src/kernels/cuda/notes/decode_timeline.md).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_env.sh
OUT=${OUT:-/tmp/corolla-gpu-out}
mkdir -p "$OUT"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
unpack_bundle || exit 1
bin=gpu-bundle/cuda_kernels_test
if [ ! -x "$bin" ]; then
  echo "gpu_run.sh: $bin missing: run scripts/build_gpu.sh and carry gpu-bundle" >&2
  exit 1
fi
if ldd "$bin" | grep -q "not found"; then
  echo "gpu_run.sh: missing shared libraries:"; ldd "$bin" | grep "not found"; exit 1
fi
start=$(date +%s)
rc=0
if [ -z "${COROLLA_SKIP_TESTS:-}" ]; then
  "$bin" --gtest_filter="${COROLLA_GTEST_FILTER:-*}" >"$OUT/cuda_kernels_test.log" 2>&1
  rc=$?
fi
end=$(date +%s)
touch "$OUT/cuda_kernels_test.log"


echo "=== cuda_kernels_test exit $rc in $((end - start)) s; full log: $OUT/cuda_kernels_test.log"
grep -E "^\[  FAILED  \]|Failure|error:|CUDA error|cuBLAS error|Check failed" "$OUT/cuda_kernels_test.log" | head -40
echo "=== results table"
sed -n '/^kernel  /,$p' "$OUT/cuda_kernels_test.log"
echo "=== summary"
grep -E "max error vs golden|vs one prefill|demo greedy|hybrid under preemption|HBM copy|decode layer|decode ops:|moe experts|decode graph|decode step|demo chats with|graphs vs cpu|^\[  PASSED  \]|^\[  FAILED  \]|tests ran" \
  "$OUT/cuda_kernels_test.log"
for spec in ${COROLLA_BENCH_DECODE:-}; do
  cfg=${spec%%:*}; layers=${spec##*:}; name=$(basename "$cfg" .json)
  echo "=== bench decode ($cfg, layers $layers)"
  gpu-bundle/corolla bench decode --config "$cfg" --random-weights --device cuda --layers "$layers" \
    --batch "${COROLLA_BENCH_BATCHES:-1,8,64,256}" --context "${COROLLA_BENCH_CONTEXTS:-1024}" --steps 15 \
    ${COROLLA_BENCH_DECODE_ARGS:-} 2>&1 | tee "$OUT/bench_decode_$name.log" || rc=1
done
if [ -n "${COROLLA_BENCH:-}" ] && [ "${COROLLA_BENCH_QWEN3:-1}" != 0 ]; then
  cfg=tests/data/configs/qwen3-30b-a3b.json
  layers=${COROLLA_BENCH_LAYERS:-0}
  echo "=== bench decode ($cfg, layers ${layers} (0: all))"
  gpu-bundle/corolla bench decode --config $cfg --random-weights --device cuda --layers "$layers" \
    --batch "${COROLLA_BENCH_BATCHES:-1,8,64,256}" --context "${COROLLA_BENCH_CONTEXTS:-1024}" --steps 15 \
    ${COROLLA_BENCH_QWEN3_ARGS:-} 2>&1 | tee "$OUT/bench_decode.log" || rc=1
  echo "=== bench prefill"
  gpu-bundle/corolla bench prefill --config $cfg --random-weights --device cuda --layers "$layers" \
    --context "${COROLLA_BENCH_PREFILL:-1024,4096}" --steps 3 2>&1 | tee "$OUT/bench_prefill.log" || rc=1
fi
exit $rc
