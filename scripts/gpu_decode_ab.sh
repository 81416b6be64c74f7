#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, from the repository root): an A/B of the
# decode step (`corolla bench decode`, graph replay) or a prompt (AB_BENCH=prefill) across builds
# and environment variants.
# Every (build, variant) runs once a round and the rounds are interleaved, so that each figure's
# baseline ran on the same machine minutes apart (machines differ by ~0.03 ms a step: only
# same-call pairs compare). Logs in $OUT/ab.tar.gz (ab/*.log, ab/summary.txt); a summary of the
# graph lines (prefill: the prompt lines) at the end.
#   AB_BENCH     decode (default) or prefill (then AB_ARGS defaults to "--context 8192", 3 steps)
#   AB_BINS      builds to compare (default gpu-bundle/corolla), e.g. "gpu-bundle/corolla
#                gpu-bundle/base_corolla" with the previous build carried beside the new one
#   AB_VARIANTS  NAME:ENV[,ENV...] each (default "default:"), e.g.
#                "default: split128:COROLLA_ATTN_DECODE_SPLIT_KEYS=128"
#   AB_BASE_VARIANTS  those of AB_VARIANTS that the builds after the first run (default: all),
#                e.g. "default:" where the other variants' variables mean nothing to the baseline
#   AB_ARGS      bench flags (default "--batch 1 --context 1024,8192")
#   AB_ROUNDS    (default 2); AB_CONFIG (default tests/data/configs/qwen3-30b-a3b.json)
#   AB_TIMELINE=1  also an eager kernel timeline (COROLLA_TIMELINE=3000) per build and variant
#                (src/kernels/cuda/notes/decode_timeline.md); =graph: of the bench's first graph
#                instead, at its third replay (COROLLA_TIMELINE=0,COROLLA_TIMELINE_GRAPH=3); =both:
#                the two; AB_TIMELINE_ARGS its bench flags
#                (default "--batch 1 --context 1024"; past batch 1 a step is more launches than
#                the window's default 400: add COROLLA_TIMELINE_LAUNCHES to the variants; with
#                --skip-op a step has fewer: a variant's COROLLA_TIMELINE=1000 overrides the start)
#   AB_TESTS     a gtest filter of gpu-bundle/cuda_kernels_test to run first (the bundle unpacked
#                here), e.g. "CudaKernelTest.QkNormRope*"; its log in $OUT/ab_tests.log;
#                AB_TESTS_TIMEOUT its limit in seconds (default 300), past which the rounds run
#                anyway and the test it hung in is named
#   AB_BENCH_TIMEOUT  each bench run's limit in seconds (default 300); a variant that may hang
#                gets a short one so that the rest of the call still runs
#   AB_NCU       a kernel-name regex: one launch of it (the fourth) profiled by ncu in the first
#                build and variant, after the rounds; $OUT/ncu.log; AB_NCU_ARGS its bench flags
#                (default AB_ARGS). Always --clock-control none:
#                ncu's default locks the clocks to base while it profiles, and these machines'
#                clocks are not ours to change.
#   AB_NCU_SOURCE=1  also keep that profile as $OUT/ncu.ncu-rep and print its per-instruction
#                page (SASS with each instruction's stall samples) into $OUT/ncu_source.csv
# Two builds and the test binary exceed the 64 MiB a call carries: bundle and pack them here with
# `COROLLA_PACK=1 COROLLA_BASE=<previous corolla> scripts/build_gpu.sh` and carry ["mgpu-bundle"];
# this script unpacks that into gpu-bundle/ first.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_env.sh
OUT=${OUT:-/tmp/corolla-gpu-out}
logs=$OUT/ab
mkdir -p "$logs" gpu-bundle
unpack_bundle || exit 1
bins=${AB_BINS:-gpu-bundle/corolla}
variants=${AB_VARIANTS:-default:}
kind=${AB_BENCH:-decode}
case $kind in
  decode) args=${AB_ARGS:---batch 1 --context 1024,8192} steps=10 pattern='^ +graph' ;;
  prefill) args=${AB_ARGS:---context 8192} steps=3 pattern='% of the matmul peak' ;;
  *) echo "gpu_decode_ab.sh: AB_BENCH is decode or prefill, not $kind" >&2; exit 1 ;;
esac
rounds=${AB_ROUNDS:-2}
config=${AB_CONFIG:-tests/data/configs/qwen3-30b-a3b.json}
for bin in $bins; do
  if [ ! -x "$bin" ]; then echo "gpu_decode_ab.sh: $bin missing" >&2; exit 1; fi
done
if [ -n "${AB_TESTS:-}" ]; then
  timeout "${AB_TESTS_TIMEOUT:-300}" gpu-bundle/cuda_kernels_test --gtest_filter="$AB_TESTS" \
    >"$OUT/ab_tests.log" 2>&1
  rc=$?
  echo "=== cuda_kernels_test --gtest_filter=$AB_TESTS: exit $rc"
  if [ "$rc" = 124 ]; then  # a hang: name the test it was in
    echo "=== timed out after ${AB_TESTS_TIMEOUT:-300} s in: $(grep '^\[ RUN' "$OUT/ab_tests.log" | tail -1)"
  fi
  grep -E "^\[  (PASSED|FAILED)  \]|Failure" "$OUT/ab_tests.log" | head -20
fi

# bench LOG BIN VARIANT_ENV [ARGS...]: one run, its output in LOG.
bench() {
  local log=$1 bin=$2 envs=$3
  shift 3
  local -a env_args=()
  IFS=',' read -r -a env_args <<<"$envs"
  timeout "${AB_BENCH_TIMEOUT:-300}" env "${env_args[@]}" "$bin" bench "$kind" --config "$config" --random-weights --device cuda \
    --steps "$steps" "$@" >"$log" 2>&1
}

# runs BIN VARIANT: whether the pair runs (the first build every variant, the others
# AB_BASE_VARIANTS).
first_bin=${bins%% *}
runs() {
  [ "$1" = "$first_bin" ] && return 0
  case " ${AB_BASE_VARIANTS:-$variants} " in *" $2 "*) return 0 ;; esac
  return 1
}
summary=()
for r in $(seq 1 "$rounds"); do
  for v in $variants; do
    name=${v%%:*} envs=${v#*:}
    for bin in $bins; do
      runs "$bin" "$v" || continue
      tag="$(basename "$bin").$name.r$r"
      # shellcheck disable=SC2086  # args holds several flags
      bench "$logs/$tag.log" "$bin" "$envs" $args
      rc=$?
      line="$tag (rc $rc):$(grep -E "$pattern" "$logs/$tag.log" | sed -E 's/^ +(graph +)?/ | /; s/, [0-9.]+ tokens\/s//' | tr -d '\n')"
      echo "$line"
      summary+=("$line")
    done
  done
done
if [ -n "${AB_NCU:-}" ]; then
  v=${variants%% *} bin=${bins%% *}
  IFS=',' read -r -a ncu_env <<<"${v#*:}"
  # shellcheck disable=SC2086  # args holds several flags
  timeout 400 env "${ncu_env[@]}" /usr/local/cuda/bin/ncu --clock-control none --kernel-name "regex:$AB_NCU" \
    --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section SourceCounters ${AB_NCU_SOURCE:+-o "$OUT/ncu"} \
    "$bin" bench "$kind" --config "$config" --random-weights --device cuda --steps 1 ${AB_NCU_ARGS:-$args} \
    >"$OUT/ncu.log" 2>&1
  echo "=== ncu $AB_NCU ($bin, ${v%%:*}): exit $?, $OUT/ncu.log"
  if [ -n "${AB_NCU_SOURCE:-}" ]; then  # (with -o the sections print only from the report)
    /usr/local/cuda/bin/ncu --import "$OUT/ncu.ncu-rep" --page details >>"$OUT/ncu.log" 2>&1
    /usr/local/cuda/bin/ncu --import "$OUT/ncu.ncu-rep" --page source --print-source sass --csv \
      >"$OUT/ncu_source.csv" 2>&1
    echo "=== ncu source page: exit $?, $OUT/ncu_source.csv ($(wc -l <"$OUT/ncu_source.csv") lines)"
  fi
  grep -E "Duration|Throughput|Issued Warp|Executed Instructions |Registers Per|Achieved Occupancy" "$OUT/ncu.log" | head -20
fi
case "${AB_TIMELINE:-0}" in
  1) timelines="timeline:COROLLA_TIMELINE=3000" ;;
  graph) timelines="graph_timeline:COROLLA_TIMELINE=0,COROLLA_TIMELINE_GRAPH=3" ;;
  both) timelines="timeline:COROLLA_TIMELINE=3000 graph_timeline:COROLLA_TIMELINE=0,COROLLA_TIMELINE_GRAPH=3" ;;
  *) timelines="" ;;
esac
for mode in $timelines; do
  for v in $variants; do
    name=${v%%:*} envs=${v#*:}
    for bin in $bins; do
      runs "$bin" "$v" || continue
      tag="$(basename "$bin").$name.${mode%%:*}"
      # shellcheck disable=SC2086  # several flags
      bench "$logs/$tag.log" "$bin" "${mode#*:}${envs:+,$envs}" ${AB_TIMELINE_ARGS:---batch 1 --context 1024}
      echo "=== $tag: $logs/$tag.log"
      sed -n '/^timeline:/,/^  spread/p' "$logs/$tag.log" | grep -v "^  spread"
      sed -n '/^  phases/,/^decode:/p' "$logs/$tag.log" | grep -v "^decode:"
    done
  done
done
echo "=== summary ($kind: ms a step or a prompt, % of the limit measured in the same run)"
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
# The device tool returns at most 8 files from $OUT: the logs travel as one archive.
tar czf "$OUT/ab.tar.gz" -C "$OUT" ab && rm -rf "$logs"
