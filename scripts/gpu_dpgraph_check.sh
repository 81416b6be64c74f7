#!/usr/bin/env bash
# Decode graphs under `serve --dp 2 --ep 2` and the shared expert on the side stream (issue 6).
# Runs on nvidia-h200-x2 from the repository root with $B (default mgpu-bundle/) carried, holding
# corolla and cuda_kernels_test built from this tree (build-gpu/ or build-mgpu/, sm_90a):
#   mkdir -p mgpu-bundle && for t in corolla src/kernels/cuda/cuda_kernels_test; do
#     cp build-gpu/$t mgpu-bundle/ && strip mgpu-bundle/$(basename $t); done
# Logs under $OUT; a summary at the end. Success:
#   1. side-stream kernel tests pass, also with COROLLA_CUDA_POISON_EMPTY=1;
#   2. --dp 2 --ep 2 logits of the hybrid and DeepSeek-V3 fixtures with the overlap on equal those
#      with it off exactly ("max diff 0"), also poisoned;
#   3. serve_dp_check PASS with the default (--ep-capacity 16: graphs, logged as "decode graphs up
#      to context ..., N start-up forwards" on both ranks; "fixed-capacity rounds: X of Y", X > 0)
#      and with --ep-capacity 0 (the old path);
#   4. bench decode rows of the overlap on vs off (COROLLA_SHARED_EXPERT_OVERLAP=1 / 0): the
#      overlap's effect on the step time, eager and graph.
# COROLLA_SKIP_BENCH=1 skips 4.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # nor torch's multicast
OUT=${OUT:-/tmp/corolla-dpgraph-out}
B=${B:-mgpu-bundle}
mkdir -p "$OUT"
summary=()
note() { summary+=("$*"); echo "$*"; }

# 1. Side stream vs sequential, bit for bit; the allocator's deferred frees.
filter='*SideStream*:*DeferredFrees*'
for poison in 0 1; do
  COROLLA_CUDA_POISON_EMPTY=$poison timeout 300 $B/cuda_kernels_test --gtest_filter="$filter" >"$OUT/side_stream_p$poison.log" 2>&1
  note "cuda_kernels_test $filter (poison $poison): rc $? ($(grep -E '^\[  (PASSED|FAILED)' "$OUT/side_stream_p$poison.log" | tr '\n' ' '))"
done

# 2. The overlap changes no bit of the model's output (DP-EP logits, eager, sized exchange).
for m in qwen3.5-moe-hybrid deepseek-v3; do
  golden=tests/data/golden/$m.safetensors
  a=$(python3 scripts/compare_logits.py ids "$golden" ids_2); b=$(python3 scripts/compare_logits.py ids "$golden" ids_4)
  for poison in 0 1; do
    for ov in 0 1; do
      COROLLA_CUDA_POISON_EMPTY=$poison COROLLA_SHARED_EXPERT_OVERLAP=$ov timeout 120 $B/corolla logits --device cuda \
        --model tests/data/models/$m --ids "$a;$b;$a" --out "$OUT/${m}_ov$ov.safetensors" --dp 2 --ep 2 \
        2>>"$OUT/logits.err" || note "$m logits overlap $ov poison $poison FAILED"
    done
    note "$m dp2/ep2 logits, overlap on vs off (poison $poison): $(python3 scripts/compare_logits.py diff "$OUT/${m}_ov1.safetensors" "$OUT/${m}_ov0.safetensors" 0)"
  done
done

# 3. Serving: graphs on (default --ep-capacity 16 on cuda) and the sized-only path.
for args in "" "--ep-capacity 0"; do
  log="$OUT/serve_dp_check_${args// /_}.log"
  PYTHONUNBUFFERED=1 timeout 600 python3 scripts/serve_dp_check.py --bin $B/corolla --device cuda --dp-args="$args" >"$log" 2>&1
  note "serve_dp_check --dp-args='$args': rc $? | $(grep -E 'decode graphs|fixed-capacity rounds|serve_dp_check:' "$log" | tr -s ' ' | tr '\n' ';')"
done

# 4. The overlap's effect on the decode step (bench decode, fixed exchange = the largest batch).
if [ -z "${COROLLA_SKIP_BENCH:-}" ]; then
  for cfg in "qwen3-next-80b-a3b.json --layers 12" "deepseek-v3.json --layers 5"; do
    name=${cfg%%.json*}
    for ov in 1 0; do
      log="$OUT/bench_${name}_ov$ov.log"
      COROLLA_SHARED_EXPERT_OVERLAP=$ov timeout 400 $B/corolla bench decode --config tests/data/configs/$cfg --random-weights \
        --device cuda --context 1024 --steps 20 --batch 1,16,64 --dp 2 --ep 2 >"$log" 2>&1 || note "bench $name overlap $ov FAILED (rc $?)"
      note "bench decode $name dp2/ep2 overlap $ov: $(grep -E '^  (eager|graph) |aggregate|batch' "$log" | tr -s ' ' | tr '\n' ';')"
    done
  done
fi

echo "=== summary"
printf '%s\n' "${summary[@]}"
