#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, repository root, mgpu-bundle/ or gpu-bundle/
# carried; build with COROLLA_PACK=1 scripts/build_gpu.sh): the sampler's checks and its A/B in
# the engine, in one call.
#   1. the sampling kernels against the CPU sampler (cuda_kernels_test --gtest_filter=*Sample*),
#   2. one Sample call's latency a path (CudaPerf.Sample), plain and under ncu (GPU time),
#   3. `bench serve --in-process` on Qwen3-30B-A3B random weights (1024 in) under each mode of
#      SA_MODES, the modes interleaved over SA_ROUNDS rounds, then greedy,
#   4. with SA_TIMELINE=1 the fused kernel's phases inside the engine for each of SA_TL_MODES
#      (default SA_MODES): a timeline of the NucleusFused launches between graph steps
#      (COROLLA_TIMELINE_ONLY; concurrency 1, the window 500 launches in).
#   5. with SA_SASS=1 the size of each sampling kernel's code (scripts/gpu_code_sizes.sh).
# Env (defaults): SA_TESTS (1), SA_PERF (1), SA_NCU (1), SA_TIMELINE (1), SA_SASS (0), SA_ROUNDS (2),
# SA_MODES ("default=" : name=VAR=V,VAR=V ...; empty settings run the defaults),
# SA_SAMPLING ("--temperature 0.6 --top-k 20 --top-p 0.95": Qwen3's generation_config),
# SA_SERVE ("1:3:256": concurrency:prompts:output tokens, several separated by spaces; none).
# Logs under $OUT; the summary (ITL mean / p50 a run) in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_env.sh
OUT=${OUT:-/tmp/corolla-sampler-out}
mkdir -p "$OUT"
unpack_bundle || exit 1
bin=gpu-bundle/corolla
tests=gpu-bundle/cuda_kernels_test
read -r -a modes <<<"${SA_MODES:-default=}"
read -r -a serves <<<"${SA_SERVE:-1:3:256}"
[ "${serves[0]:-}" = none ] && serves=()
read -r -a sampling <<<"${SA_SAMPLING:---temperature 0.6 --top-k 20 --top-p 0.95}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

# Runs corolla "$@" with the settings "VAR=V,VAR=V" of $1 in its environment; BIN=PATH runs that
# build instead (e.g. gpu-bundle/base_corolla: build_gpu.sh's COROLLA_BASE).
with() {
  local settings=$1
  shift
  local envs=() run=$bin
  IFS=, read -r -a envs <<<"$settings"
  local e kept=()
  for e in ${envs[@]+"${envs[@]}"}; do
    case $e in BIN=*) run=${e#BIN=} ;; *) kept+=("$e") ;; esac
  done
  env ${kept[@]+"${kept[@]}"} "$run" "$@"
}

if [ "${SA_TESTS:-1}" = 1 ]; then
  "$tests" --gtest_filter='*Sample*:-CudaPerf.*' >"$OUT/tests.log" 2>&1
  echo "tests exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tr '\n' ' ')" |
    tee "$OUT/tests.txt"
fi
if [ "${SA_PERF:-1}" = 1 ]; then
  "$tests" --gtest_filter=CudaPerf.Sample >"$OUT/perf.log" 2>&1
  grep "sample perf" "$OUT/perf.log"
  if [ "${SA_NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
    ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum \
      "$tests" --gtest_filter=CudaPerf.Sample >"$OUT/ncu.log" 2>&1
    python3 - "$OUT/ncu.log" <<'EOF'
import re, sys, collections
# Per kernel and grid (ncu names them "ns::<unnamed>::Name(Params) (x, y, z)x(..)"): the GPU
# time's percentiles over every launch of the test (its modes and repetitions mixed).
t = collections.defaultdict(list)
name = None
for line in open(sys.argv[1]):
    m = re.search(r"::(\w+)\([^()]*\) \((\d+), (\d+), (\d+)\)x", line)
    if m:
        name = "%s (%s,%s)" % (m.group(1), m.group(2), m.group(3))
        continue
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        v = float(m.group(2).replace(",", ""))
        t[name].append(v / 1000 if m.group(1) == "ns" else v)
        name = None
for k, v in sorted(t.items()):
    v.sort()
    print("ncu %-36s n %4d  p10 %7.1f  p50 %7.1f  p90 %7.1f us" % (k, len(v), v[len(v)//10], v[len(v)//2], v[9*len(v)//10]))
EOF
  fi
fi

args=(bench serve --in-process --device cuda --config tests/data/configs/qwen3-30b-a3b.json
      --random-weights --max-num-seqs 256 --max-batch-tokens 2048 --gpu-memory-utilization 0.9
      --input-len 1024 --warmup-prompts 1 --json --no-progress)
summary() {  # name json
  python3 - "$1" "$2" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
try:
    r = json.JSONDecoder().raw_decode(open(sys.argv[2]).read().lstrip())[0]
    print("%-28s c%-3d ITL mean %.4f p50 %.4f ms  %.1f tok/s  failed %d" % (sys.argv[1], r["concurrency"],
          r["itl"]["mean_ms"], r["itl"]["p50_ms"], r["output_throughput"], r["failed"]))
except Exception as e:
    print("%-28s no result (%s)" % (sys.argv[1], e))
EOF
}
for serve in ${serves[@]+"${serves[@]}"}; do
  IFS=: read -r conc prompts outlen <<<"$serve"
  load=(--concurrency "$conc" --num-prompts "$prompts" --output-len "$outlen")
  for round in $(seq 1 "${SA_ROUNDS:-2}"); do
    for mode in "${modes[@]}"; do
      name=${mode%%=*}
      with "${mode#*=}" "${args[@]}" "${load[@]}" "${sampling[@]}" \
        >"$OUT/serve_${name}_c${conc}_r${round}.json" 2>"$OUT/serve_${name}_c${conc}_r${round}.err"
      summary "$name r$round" "$OUT/serve_${name}_c${conc}_r${round}.json"
    done
  done
  "$bin" "${args[@]}" "${load[@]}" >"$OUT/serve_greedy_c${conc}.json" 2>"$OUT/serve_greedy_c${conc}.err"
  summary "greedy" "$OUT/serve_greedy_c${conc}.json"
done

read -r -a tl_modes <<<"${SA_TL_MODES:-${SA_MODES:-default=}}"
if [ "${SA_TIMELINE:-1}" = 1 ]; then
  for mode in "${tl_modes[@]}"; do
    name=${mode%%=*}
    settings=${mode#*=}
    with "COROLLA_TIMELINE=500,COROLLA_TIMELINE_LAUNCHES=12,COROLLA_TIMELINE_ONLY=NucleusFused${settings:+,$settings}" \
      "${args[@]}" --concurrency 1 --num-prompts 3 --output-len 256 "${sampling[@]}" \
      >"$OUT/timeline_${name}.txt" 2>"$OUT/timeline_${name}.err"
    echo "== timeline $name"
    sed -n '/^timeline:/,/^{/p' "$OUT/timeline_${name}.txt" | grep -v -E "^\{|spread|entry .* waited .* exit .* " | head -30
    grep -E "^  #" "$OUT/timeline_${name}.txt" | head -12
  done
fi
if [ "${SA_SASS:-0}" = 1 ]; then
  scripts/gpu_code_sizes.sh "$tests" 'Nucleus|SampleKernel|TopKSelect|ArgmaxSlice|SortKeys|PrepareSort' |
    tee "$OUT/code_sizes.txt"
fi
[ -f "$OUT/tests.txt" ] && cat "$OUT/tests.txt"
# The device tool returns a few files: the logs go back as one archive beside the summary.
(cd "$OUT" && tar czf logs.tar.gz --exclude=logs.tar.gz --exclude=summary.txt ./* &&
  find . -type f ! -name logs.tar.gz ! -name summary.txt -delete)
