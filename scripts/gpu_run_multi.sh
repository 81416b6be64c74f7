#!/usr/bin/env bash
# Runs on the 2-GPU machine (device tool `run`, kind nvidia-h200-x2, from the repository root,
# with mgpu-bundle/ carried): the multi-GPU checks and the all-reduce timing, logs under $OUT,
# a short summary last. Build the bundle here first:
#   cmake -S . -B build-mgpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOROLLA_CUDA=ON \
#     -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90a -DCOROLLA_STATIC_DEPS=ON
#   cmake --build build-mgpu -j2 --target corolla corolla_parallel_bench
#   mkdir -p mgpu-bundle && for t in corolla corolla_parallel_bench; do cp build-mgpu/$t mgpu-bundle/ && strip mgpu-bundle/$t; done
# COROLLA_SKIP_BENCH=1 skips corolla_parallel_bench; COROLLA_TP (default 2) sets the ranks.
# COROLLA_ALLREDUCE=auto|nccl|oneshot|twoshot picks the TP all-reduce (default auto: the NVLink
# kernels of parallel/cuda/nvl_allreduce.h for small messages, NCCL above).
# COROLLA_SKIP_TP=1 skips the --tp checks; COROLLA_SKIP_DPEP=1 the --dp 2 --ep 2 checks, and
# COROLLA_SKIP_DPEP_BENCH=1 only their Qwen3-30B-A3B decode benchmark (COROLLA_DPEP_LAYERS: its
# depth, default all 48; COROLLA_DPEP_CONTEXT: context, default 1024).
# Checks: NCCL all-reduce and all-to-all exactness, the expert-id kernel and the DP-EP exchange
# (corolla_parallel_bench); logits of the qwen3-moe / qwen3-dense / deepseek-v3 / deepseek-v3-fp8
# fixtures with --tp 2 against one GPU (bf16 tolerance) and against the Hugging Face goldens
# (DeepSeek-V3, issue 8: MLA heads split, prefill in the decompressed form; the FP8 fixture's
# shards cut 128 x 128 scale blocks); greedy generation of the demo model and of the two
# DeepSeek-V3 fixtures (decode in the absorbed form) with --tp 2 against one GPU; the qwen3.5
# hybrid (issue 7) with --tp 2 against one GPU and its golden, one prefill and token by token,
# f32 and bf16 recurrent state, and its greedy generation. DP-EP (issue 6): logits of qwen3-moe and the qwen3.5 hybrid
# with --dp 2 --ep 2 against one GPU for 1 sequence (rank 1 idle), 2 and 3; greedy generation of
# two prompts; the DeepSeek-V3 fixtures' logits and greedy generation with --dp 2 --ep 2 (MLA
# whole per rank, routed experts split) and `bench decode` of its shape at 5 layers (batch 64
# per GPU vs one GPU); `bench decode` of Qwen3-30B-A3B (random weights) at batch 64 and 256 per GPU,
# DP 2 + EP 2 against one GPU at the same per-GPU batch (two independent replicas would do 2x).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
# The FP8 fixture's checks below are against one GPU and the golden at bf16 tolerances: its
# weights dequantised (CUDA's default is native FP8; cuda_kernels_test's CudaFp8Model checks that).
export COROLLA_FP8=${COROLLA_FP8:-dequant}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/corolla-mgpu-out}
mkdir -p "$OUT"
B=mgpu-bundle
TP=${COROLLA_TP:-2}
summary=()
note() { summary+=("$*"); echo "$*"; }
same_ids() {  # equal-prefix summary of two id lists
  python3 -c "import sys; a=sys.argv[1].split(','); b=sys.argv[2].split(','); n=next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), min(len(a),len(b))); print(f'{n}/{len(a)} tokens equal' + (' IDENTICAL' if a==b else ''))" "$1" "$2"
}

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m 2>&1 | tee -a "$OUT/gpus.txt"
if ldd $B/corolla | grep "not found"; then echo "missing shared libraries"; exit 1; fi

if [ -z "${COROLLA_SKIP_BENCH:-}" ]; then
  echo "=== corolla_parallel_bench --tp $TP"
  NCCL_DEBUG=INFO timeout 300 $B/corolla_parallel_bench --tp "$TP" >"$OUT/parallel_bench.log" 2>"$OUT/parallel_bench.err"
  rc=$?
  grep -v "NCCL INFO" "$OUT/parallel_bench.log"
  note "parallel_bench exit $rc; $(grep -c exact "$OUT/parallel_bench.log") exact checks, $(grep -c WRONG "$OUT/parallel_bench.log") wrong"
  note "nccl: $(cat "$OUT"/parallel_bench.* | grep -m1 -o 'NCCL version [0-9.+a-z]*'); $(cat "$OUT"/parallel_bench.* | grep -m1 -o '[0-9]* nvls channels'); $(cat "$OUT"/parallel_bench.* | grep -m1 -o 'Channel 00/[0-9]* : 0\[[0-9]\] -> 1\[[0-9]\] via [A-Za-z/0-9]*')"
  [ $rc -ne 0 ] && tail -20 "$OUT/parallel_bench.err"
fi

for m in qwen3-moe qwen3-dense deepseek-v3 deepseek-v3-fp8; do
  [ -n "${COROLLA_SKIP_TP:-}" ] && break
  golden=tests/data/golden/$m.safetensors
  for k in 2 4; do
    ids=$(python3 scripts/compare_logits.py ids "$golden" ids_$k)
    one=$OUT/${m}_${k}_tp1.safetensors; two=$OUT/${m}_${k}_tp$TP.safetensors
    timeout 120 $B/corolla logits --device cuda --model tests/data/models/$m --ids "$ids" --out "$one" 2>>"$OUT/logits.err" || note "$m ids_$k: single-GPU logits FAILED"
    timeout 120 $B/corolla logits --device cuda --model tests/data/models/$m --ids "$ids" --out "$two" --tp "$TP" 2>>"$OUT/logits.err" || note "$m ids_$k: --tp $TP logits FAILED"
    note "$m ids_$k tp$TP vs 1 GPU:  $(python3 scripts/compare_logits.py diff "$two" "$one" 2e-2)"
    note "$m ids_$k tp$TP vs golden: $(python3 scripts/compare_logits.py diff "$two" "$golden:logits_$k" 2e-2)"
    note "$m ids_$k 1 GPU vs golden: $(python3 scripts/compare_logits.py diff "$one" "$golden:logits_$k" 2e-2)"
    rm -f "$one" "$two"
  done
done

for prompt in 1,2,3,4,5 17,300,42,1999,7,7,7,512,3000,88; do
  [ -n "${COROLLA_SKIP_TP:-}" ] && break
  a=$(timeout 120 $B/corolla generate --device cuda --prompt-ids $prompt --max-tokens 64 --temperature 0 --ignore-eos 2>>"$OUT/generate.err")
  b=$(timeout 120 $B/corolla generate --device cuda --prompt-ids $prompt --max-tokens 64 --temperature 0 --ignore-eos --tp "$TP" 2>>"$OUT/generate.err")
  echo "1 GPU : $a" >>"$OUT/generate.log"; echo "tp$TP  : $b" >>"$OUT/generate.log"
  same=$(same_ids "$a" "$b")
  note "demo greedy prompt $prompt tp$TP vs 1 GPU: $same"
done

# DeepSeek-V3 decode (absorbed MLA) under TP: three prompts, greedy. bf16 may flip a close
# token, so this reports the equal prefix; the logits above are the pass/fail check.
for m in deepseek-v3 deepseek-v3-fp8; do
  [ -n "${COROLLA_SKIP_TP:-}" ] && break
  prompts="1,2,3,4,5;17,300,42,999,7,7,7,512,88;9,9,9"  # the fixtures' vocabulary is 1024
  a=$(timeout 120 $B/corolla generate --device cuda --model tests/data/models/$m --prompt-ids "$prompts" --max-tokens 32 --temperature 0 --ignore-eos 2>>"$OUT/generate.err") || note "$m generate 1 GPU FAILED"
  b=$(timeout 120 $B/corolla generate --device cuda --model tests/data/models/$m --prompt-ids "$prompts" --max-tokens 32 --temperature 0 --ignore-eos --tp "$TP" 2>>"$OUT/generate.err") || note "$m generate --tp $TP FAILED"
  printf '%s 1 GPU:\n%s\n%s tp%s:\n%s\n' "$m" "$a" "$m" "$TP" "$b" >>"$OUT/generate.log"
  for i in 1 2 3; do
    x=$(echo "$a" | sed -n ${i}p); y=$(echo "$b" | sed -n ${i}p)
    same=$(same_ids "$x" "$y")
    note "$m greedy prompt $i of 3 tp$TP vs 1 GPU: $same"
  done
done

# The qwen3.5 hybrid under TP (issue 7: Gated DeltaNet split by heads, gated attention, shared
# expert column/row parallel): logits --tp 2 vs 1 GPU and vs the golden, in one prefill and token
# by token (--chunk 1: the decode path, the recurrent state rounded after every token when bf16),
# for the f32 and the bf16 recurrent state (--linear-state-dtype); then greedy generation.
for k in 2 4; do
  [ -n "${COROLLA_SKIP_TP:-}" ] && break
  m=qwen3.5-moe-hybrid; golden=tests/data/golden/$m.safetensors
  ids=$(python3 scripts/compare_logits.py ids "$golden" ids_$k)
  for mode in "prefill:" "chunk1:--chunk 1" "chunk1-bf16:--chunk 1 --linear-state-dtype bf16"; do
    name=${mode%%:*}; extra=${mode#*:}
    one=$OUT/${m}_${k}_${name}_tp1.safetensors; two=$OUT/${m}_${k}_${name}_tp$TP.safetensors
    timeout 120 $B/corolla logits --device cuda --model tests/data/models/$m --ids "$ids" --out "$one" $extra 2>>"$OUT/logits.err" || note "$m ids_$k $name: single-GPU logits FAILED"
    timeout 120 $B/corolla logits --device cuda --model tests/data/models/$m --ids "$ids" --out "$two" $extra --tp "$TP" 2>>"$OUT/logits.err" || note "$m ids_$k $name: --tp $TP logits FAILED"
    # This fixture amplifies bf16 rounding along the sequence (one GPU is 5-6e-2 off its golden;
    # cuda_model_test.cc explains the 1e-1 bound), so TP's other summation order moves it as much.
    note "$m ids_$k $name tp$TP vs 1 GPU:  $(python3 scripts/compare_logits.py diff "$two" "$one" 1e-1)"
    note "$m ids_$k $name tp$TP vs golden: $(python3 scripts/compare_logits.py diff "$two" "$golden:logits_$k" 1e-1)"
    note "$m ids_$k $name 1 GPU vs golden: $(python3 scripts/compare_logits.py diff "$one" "$golden:logits_$k" 1e-1)"
    # Every new tensor filled with NaN: a read of memory nothing wrote changes the logits.
    COROLLA_CUDA_POISON_EMPTY=1 timeout 120 $B/corolla logits --device cuda --model tests/data/models/$m --ids "$ids" --out "$one" $extra --tp "$TP" 2>>"$OUT/logits.err" || note "$m ids_$k $name: poisoned --tp $TP logits FAILED"
    note "$m ids_$k $name tp$TP poisoned vs not: $(python3 scripts/compare_logits.py diff "$one" "$two" 0)"
    rm -f "$one" "$two"
  done
done
if [ -z "${COROLLA_SKIP_TP:-}" ]; then
  m=qwen3.5-moe-hybrid; prompts="1,2,3,4,5;17,300,42,999,7,7,7,512,88;9,9,9"
  for dtype in f32 bf16; do
    a=$(timeout 120 $B/corolla generate --device cuda --model tests/data/models/$m --prompt-ids "$prompts" --max-tokens 32 --temperature 0 --ignore-eos --linear-state-dtype $dtype 2>>"$OUT/generate.err") || note "$m generate 1 GPU FAILED"
    b=$(timeout 120 $B/corolla generate --device cuda --model tests/data/models/$m --prompt-ids "$prompts" --max-tokens 32 --temperature 0 --ignore-eos --linear-state-dtype $dtype --tp "$TP" 2>>"$OUT/generate.err") || note "$m generate --tp $TP FAILED"
    printf '%s %s state 1 GPU:\n%s\n%s %s state tp%s:\n%s\n' "$m" "$dtype" "$a" "$m" "$dtype" "$TP" "$b" >>"$OUT/generate.log"
    for i in 1 2 3; do
      x=$(echo "$a" | sed -n ${i}p); y=$(echo "$b" | sed -n ${i}p)
      same=$(same_ids "$x" "$y")
      note "$m ($dtype state) greedy prompt $i of 3 tp$TP vs 1 GPU: $same"
    done
  done
fi

# --- DP-EP: each rank owns every 2nd sequence, experts split over both GPUs.
# DP x TP's MoE path (issue 6: each TP rank dispatches 1/tp of the tokens, zeros elsewhere, the
# TP all-reduce assembles) on two GPUs: TP-EP through that exchange (COROLLA_TP_EP_EXCHANGE=1).
# One sequence and three; logits vs 1 GPU (2e-2, the hybrid 1e-1, as the --tp checks); greedy generate
# without graphs (the sized exchange syncs on the host); bench decode with the fixed-capacity
# NVLink exchange, eager and graph. COROLLA_SKIP_DPTP=1 skips it.
if [ -z "${COROLLA_SKIP_DPTP:-}" ]; then
  for m in qwen3-moe qwen3.5-moe-hybrid deepseek-v3; do
    golden=tests/data/golden/$m.safetensors
    a=$(python3 scripts/compare_logits.py ids "$golden" ids_2); b=$(python3 scripts/compare_logits.py ids "$golden" ids_4)
    for spec in "1seq:$a" "3seqs:$b;$a;$a"; do
      name=${spec%%:*}; ids=${spec#*:}
      one=$OUT/${m}_${name}_1gpu.safetensors; two=$OUT/${m}_${name}_tpx.safetensors
      timeout 60 $B/corolla logits --device cuda --model tests/data/models/$m --ids "$ids" --out "$one" 2>>"$OUT/dptp_logits.err" || note "$m $name: single-GPU logits FAILED"
      COROLLA_TP_EP_EXCHANGE=1 timeout 60 $B/corolla logits --device cuda --model tests/data/models/$m --ids "$ids" --out "$two" --tp 2 2>>"$OUT/dptp_logits.err" || note "$m $name: --tp 2 via the exchange FAILED"
      tol=2e-2; [ "$m" = qwen3.5-moe-hybrid ] && tol=1e-1  # the hybrid fixture's bf16 amplification (see the --tp block)
      note "$m $name tp2 via the DP x TP exchange vs 1 GPU: $(python3 scripts/compare_logits.py diff "$two" "$one" $tol)"
      rm -f "$one" "$two"
    done
  done
  prompts="1,2,3,4,5;17,300,42,1999,7,7,7,512,3000,88;9,9,9"
  a=$(timeout 60 $B/corolla generate --device cuda --prompt-ids "$prompts" --max-tokens 64 --temperature 0 --ignore-eos 2>>"$OUT/dptp_generate.err")
  b=$(COROLLA_TP_EP_EXCHANGE=1 COROLLA_CUDA_GRAPHS=0 timeout 60 $B/corolla generate --device cuda --prompt-ids "$prompts" --max-tokens 64 --temperature 0 --ignore-eos --tp 2 2>>"$OUT/dptp_generate.err")
  for i in 1 2 3; do
    note "demo greedy prompt $i of 3, tp2 via the exchange vs 1 GPU: $(same_ids "$(echo "$a" | sed -n ${i}p)" "$(echo "$b" | sed -n ${i}p)")"
  done
  cfg="--config tests/data/configs/qwen3-30b-a3b.json --random-weights --device cuda --context 1024 --layers 4 --steps 10"
  COROLLA_TP_EP_EXCHANGE=1 timeout 200 $B/corolla bench decode $cfg --batch 7,64 --tp 2 >"$OUT/bench_dptp_path.log" 2>&1 || note "bench decode tp2 via the exchange FAILED (rc $?)"
  cat "$OUT/bench_dptp_path.log"
  note "bench decode tp2 via the exchange (batch 7, 64): $(grep -E '^  (eager|graph) ' "$OUT/bench_dptp_path.log" | tr -s ' ' | tr '\n' ';')"
fi

if [ -z "${COROLLA_SKIP_DPEP:-}" ]; then
  for m in qwen3-moe qwen3.5-moe-hybrid deepseek-v3 deepseek-v3-fp8; do
    golden=tests/data/golden/$m.safetensors
    a=$(python3 scripts/compare_logits.py ids "$golden" ids_2); b=$(python3 scripts/compare_logits.py ids "$golden" ids_4)
    for spec in "1seq:$a" "2seqs:$a;$b" "3seqs:$b;$a;$a"; do
      name=${spec%%:*}; ids=${spec#*:}
      one=$OUT/${m}_${name}_1gpu.safetensors; two=$OUT/${m}_${name}_dp2ep2.safetensors
      timeout 60 $B/corolla logits --device cuda --model tests/data/models/$m --ids "$ids" --out "$one" 2>>"$OUT/dpep_logits.err" || note "$m $name: single-GPU logits FAILED"
      timeout 60 $B/corolla logits --device cuda --model tests/data/models/$m --ids "$ids" --out "$two" --dp 2 --ep 2 2>>"$OUT/dpep_logits.err" || note "$m $name: --dp 2 --ep 2 logits FAILED"
      note "$m $name dp2/ep2 vs 1 GPU: $(python3 scripts/compare_logits.py diff "$two" "$one" 2e-2)"
      [ "$name" = 1seq ] && note "$m $name dp2/ep2 vs golden: $(python3 scripts/compare_logits.py diff "$two" "$golden:logits_2" 2e-2)"
      rm -f "$one" "$two"
    done
  done
  prompts="1,2,3,4,5;17,300,42,1999,7,7,7,512,3000,88;9,9,9"
  a=$(timeout 60 $B/corolla generate --device cuda --prompt-ids "$prompts" --max-tokens 64 --temperature 0 --ignore-eos 2>>"$OUT/dpep_generate.err")
  b=$(timeout 60 $B/corolla generate --device cuda --prompt-ids "$prompts" --max-tokens 64 --temperature 0 --ignore-eos --dp 2 --ep 2 2>>"$OUT/dpep_generate.err")
  printf '1 GPU:\n%s\ndp2/ep2:\n%s\n' "$a" "$b" >>"$OUT/dpep_generate.log"
  for i in 1 2 3; do
    note "demo greedy prompt $i of 3, dp2/ep2 vs 1 GPU: $(same_ids "$(echo "$a" | sed -n ${i}p)" "$(echo "$b" | sed -n ${i}p)")"
  done
  # DeepSeek-V3 DP-EP (MLA whole per rank, routed experts split): greedy, equal prefix reported
  # (bf16 near-ties of the tiny fixtures may flip a token; the logits above are the check).
  for m in deepseek-v3 deepseek-v3-fp8; do
    prompts="1,2,3,4,5;17,300,42,999,7,7,7,512,88;9,9,9"
    a=$(timeout 120 $B/corolla generate --device cuda --model tests/data/models/$m --prompt-ids "$prompts" --max-tokens 32 --temperature 0 --ignore-eos 2>>"$OUT/dpep_generate.err") || note "$m generate 1 GPU FAILED"
    b=$(timeout 120 $B/corolla generate --device cuda --model tests/data/models/$m --prompt-ids "$prompts" --max-tokens 32 --temperature 0 --ignore-eos --dp 2 --ep 2 2>>"$OUT/dpep_generate.err") || note "$m generate --dp 2 --ep 2 FAILED"
    printf '%s 1 GPU:\n%s\n%s dp2/ep2:\n%s\n' "$m" "$a" "$m" "$b" >>"$OUT/dpep_generate.log"
    for i in 1 2 3; do
      note "$m greedy prompt $i of 3, dp2/ep2 vs 1 GPU: $(same_ids "$(echo "$a" | sed -n ${i}p)" "$(echo "$b" | sed -n ${i}p)")"
    done
  done
  # DeepSeek-V3's shape, 5 layers (3 dense + 2 MoE, 256 experts, random bf16 weights): one GPU
  # against DP 2 + EP 2 at the same per-GPU batch (COROLLA_SKIP_DS_DPEP_BENCH=1 skips it).
  if [ -z "${COROLLA_SKIP_DS_DPEP_BENCH:-}" ]; then
    ds="--config tests/data/configs/deepseek-v3.json --random-weights --layers 5 --device cuda --context 1024 --steps 20"
    timeout 300 $B/corolla bench decode $ds --batch 64 >"$OUT/bench_ds_dpep_1gpu.log" 2>&1 || note "deepseek bench decode 1 GPU FAILED (rc $?)"
    timeout 300 $B/corolla bench decode $ds --batch 64 --dp 2 --ep 2 >"$OUT/bench_ds_dpep_dp2.log" 2>&1 || note "deepseek bench decode dp2/ep2 FAILED (rc $?)"
    cat "$OUT/bench_ds_dpep_1gpu.log" "$OUT/bench_ds_dpep_dp2.log"
    note "deepseek-v3 5 layers batch 64/GPU, 1 GPU: $(grep -E '^  (eager|graph) ' "$OUT/bench_ds_dpep_1gpu.log" | tr -s ' ' | tr '\n' ';')"
    note "deepseek-v3 5 layers batch 64/GPU, dp2/ep2: $(grep -E '^  (eager|graph) |aggregate' "$OUT/bench_ds_dpep_dp2.log" | tr -s ' ' | tr '\n' ';')"
  fi

  if [ -z "${COROLLA_SKIP_DPEP_BENCH:-}" ]; then
    cfg=tests/data/configs/qwen3-30b-a3b.json
    common="--config $cfg --random-weights --device cuda --context ${COROLLA_DPEP_CONTEXT:-1024} --layers ${COROLLA_DPEP_LAYERS:-0} --steps 20"
    echo "=== bench decode, 1 GPU"
    timeout 200 $B/corolla bench decode $common --batch 64,256 >"$OUT/bench_dpep_1gpu.log" 2>&1 || note "bench decode 1 GPU FAILED (rc $?)"
    cat "$OUT/bench_dpep_1gpu.log"
    for bs in 64 256; do  # the fixed-size exchange (capacity = the batch), eager and CUDA graph
      echo "=== bench decode --dp 2 --ep 2, batch $bs per GPU"
      timeout 200 $B/corolla bench decode $common --batch $bs --dp 2 --ep 2 >"$OUT/bench_dpep_dp2_b$bs.log" 2>&1 || note "bench decode dp2/ep2 batch $bs FAILED (rc $?)"
      cat "$OUT/bench_dpep_dp2_b$bs.log"
    done
    for bs in 64 256; do  # the default above is the NVLink exchange; here NCCL's all-to-all one
      echo "=== bench decode --dp 2 --ep 2, NCCL all-to-all exchange (COROLLA_EP_EXCHANGE=alltoall), batch $bs per GPU"
      COROLLA_EP_EXCHANGE=alltoall timeout 200 $B/corolla bench decode $common --batch $bs --dp 2 --ep 2 >"$OUT/bench_dpep_a2a_b$bs.log" 2>&1 || note "bench decode dp2/ep2 all-to-all exchange batch $bs FAILED (rc $?)"
      cat "$OUT/bench_dpep_a2a_b$bs.log"
    done
    echo "=== bench decode --tp 2 (attention split, experts over both GPUs), batch 64 and 256 on both"
    timeout 200 $B/corolla bench decode $common --batch 64,256 --tp 2 >"$OUT/bench_tp2.log" 2>&1 || note "bench decode tp2 FAILED (rc $?)"
    cat "$OUT/bench_tp2.log"
    echo "=== bench decode --dp 2 --ep 2 --ep-capacity 0 (exchange sized per layer, eager), batch 64 per GPU"
    timeout 200 $B/corolla bench decode $common --batch 64 --dp 2 --ep 2 --ep-capacity 0 >"$OUT/bench_dpep_dp2_b64_sized.log" 2>&1 || note "bench decode dp2/ep2 sized FAILED (rc $?)"
    cat "$OUT/bench_dpep_dp2_b64_sized.log"
    # One line per (batch, mode): DP2+EP2 aggregate tokens/s against two single-GPU replicas.
    while IFS= read -r line; do note "$line"; done < <(python3 - "$OUT" <<'PY'
import re, sys, glob
out = sys.argv[1]
def parse(path):  # {(batch, how): (ms, tokens/s, aggregate tokens/s or None)}
    res, batch, last = {}, None, None
    try:
        text = open(path).read()
    except OSError:
        return res
    for line in text.splitlines():
        m = re.search(r"decode: .*batch (\d+),", line)
        if m: batch = int(m.group(1))
        m = re.match(r"\s+(eager|graph|host)\s+([\d.]+) ms/step, ([\d.]+) tokens/s", line)
        if m:
            last = (batch, m.group(1)); res[last] = [float(m.group(2)), float(m.group(3)), None]
        m = re.search(r"aggregate over \d+ ranks: ([\d.]+) tokens/s", line)
        if m and last: res[last][2] = float(m.group(1))
    return res
one = parse(f"{out}/bench_dpep_1gpu.log")
for tag, path in [("capacity", f"{out}/bench_dpep_dp2_b64.log"), ("capacity", f"{out}/bench_dpep_dp2_b256.log"),
                  ("sized", f"{out}/bench_dpep_dp2_b64_sized.log")]:
    for (batch, how), (ms, tps, agg) in sorted(parse(path).items()):
        base = one.get((batch, how))
        if base is None or agg is None:
            print(f"bench dp2/ep2 ({tag}) batch {batch}/GPU {how}: {ms:.3f} ms/step, aggregate {agg} tokens/s (no 1-GPU peer)")
            continue
        print(f"bench dp2/ep2 ({tag}) batch {batch}/GPU {how}: {ms:.3f} ms/step, {agg:.0f} tokens/s in all; 1 GPU {base[0]:.3f} ms/step, "
              f"{base[1]:.0f} tokens/s; vs 2 replicas ({2*base[1]:.0f}): {agg/(2*base[1]):.2f}x")
PY
)
  fi
fi
grep -h -E "error|Check failed" "$OUT"/logits.err "$OUT"/generate.err "$OUT"/dpep_*.err 2>/dev/null | head -10

echo "=== summary"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/parallel_bench.log" ] && grep -A12 "^all-reduce latency" "$OUT/parallel_bench.log" | grep -v "NCCL INFO"
