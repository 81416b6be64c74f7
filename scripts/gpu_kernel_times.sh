#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, from the repository root, gpu-bundle/ or
# mgpu-bundle/ carried): the device time of every kernel of one `corolla bench prefill|decode`
# forward, each timed alone by Nsight Compute (one metric, gpu__time_duration, one pass a
# kernel; small kernels read ~2-3 us high against their time in the stream), summarised per
# kernel by scripts/ncu_kernel_summary.py. The per-kernel table of docs/benchmarks/single-gpu.md
# (Sessions 22-23) came from it.
#   KT_BENCH   prefill (default) or decode
#   KT_ARGS    one bench's shape per run, space-separated (default "1024 8192": prefill contexts;
#              for decode give "--batch 1 --context 1024" style flags in KT_FLAGS instead)
#   KT_FLAGS   extra bench flags for every run (decode: e.g. "--batch 64 --context 1024")
#   KT_CONFIG  (default tests/data/configs/qwen3-30b-a3b.json, random weights)
#   KT_LM_HEAD a substring of the LM head kernel's name, which ends each forward (the summary's
#              --lm-head; default the prompt's GemvKernel<1, 4, 1>)
# Logs: $OUT/kernels_<shape>.csv.gz (ncu's CSV) and $OUT/kernels_<shape>.txt (the summary).
# ncu runs with --clock-control none: its default locks the clocks, which are not ours to change.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_env.sh
OUT=${OUT:-/tmp/corolla-gpu-out}
mkdir -p "$OUT"
unpack_bundle || exit 1
kind=${KT_BENCH:-prefill}
config=${KT_CONFIG:-tests/data/configs/qwen3-30b-a3b.json}
shapes=${KT_ARGS:-1024 8192}
[ "$kind" = decode ] && shapes=${KT_ARGS:-step}
for shape in $shapes; do
  args=()
  [ "$kind" = prefill ] && args=(--context "$shape")
  # shellcheck disable=SC2206  # KT_FLAGS holds several flags
  args+=(${KT_FLAGS:-})
  csv=$OUT/kernels_$shape.csv
  timeout 280 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --print-units base gpu-bundle/corolla bench "$kind" --config "$config" --random-weights \
    --device cuda --steps 1 "${args[@]}" >"$csv" 2>&1
  echo "=== $kind $shape ${KT_FLAGS:-}: ncu exit $?"
  python3 scripts/ncu_kernel_summary.py "$csv" --lm-head "${KT_LM_HEAD:-GemvKernel<1, 4, 1>}" | tee "$OUT/kernels_$shape.txt" | head -20
  gzip -f "$csv"
done
