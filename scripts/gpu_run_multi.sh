#!/usr/bin/env bash
# Runs on the 2-GPU machine (device tool `run`, kind nvidia-h200-x2, from the repository root,
# with mgpu-bundle/ carried): the multi-GPU checks and the all-reduce timing, logs under $OUT,
# a short summary last. Build the bundle here first:
#   cmake -S . -B build-mgpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOROLLA_CUDA=ON \
#     -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90a -DCOROLLA_STATIC_DEPS=ON
#   cmake --build build-mgpu -j2 --target corolla corolla_parallel_bench
#   mkdir -p mgpu-bundle && for t in corolla corolla_parallel_bench; do cp build-mgpu/$t mgpu-bundle/ && strip mgpu-bundle/$t; done
# COROLLA_SKIP_BENCH=1 skips corolla_parallel_bench; COROLLA_TP (default 2) sets the ranks.
# Checks: NCCL all-reduce exactness and the expert-id kernel (corolla_parallel_bench); logits of
# the qwen3-moe / qwen3-dense fixtures with --tp 2 against one GPU (bf16 tolerance) and against
# the Hugging Face goldens; greedy generation of the demo model with --tp 2 against one GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
# NCCL 2.28.9 from python's wheel first (matches our headers; the system's is 2.28.3), then CUDA.
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on these machines
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/corolla-mgpu-out}
mkdir -p "$OUT"
B=mgpu-bundle
TP=${COROLLA_TP:-2}
summary=()
note() { summary+=("$*"); echo "$*"; }

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m 2>&1 | tee -a "$OUT/gpus.txt"
if ldd $B/corolla | grep "not found"; then echo "missing shared libraries"; exit 1; fi

if [ -z "${COROLLA_SKIP_BENCH:-}" ]; then
  echo "=== corolla_parallel_bench --tp $TP"
  NCCL_DEBUG=INFO timeout 180 $B/corolla_parallel_bench --tp "$TP" >"$OUT/parallel_bench.log" 2>"$OUT/parallel_bench.err"
  rc=$?
  grep -v "NCCL INFO" "$OUT/parallel_bench.log"
  note "parallel_bench exit $rc; $(grep -c exact "$OUT/parallel_bench.log") exact checks, $(grep -c WRONG "$OUT/parallel_bench.log") wrong"
  note "nccl: $(cat "$OUT"/parallel_bench.* | grep -m1 -o 'NCCL version [0-9.+a-z]*'); $(cat "$OUT"/parallel_bench.* | grep -m1 -o '[0-9]* nvls channels'); $(cat "$OUT"/parallel_bench.* | grep -m1 -o 'Channel 00/[0-9]* : 0\[[0-9]\] -> 1\[[0-9]\] via [A-Za-z/0-9]*')"
  [ $rc -ne 0 ] && tail -20 "$OUT/parallel_bench.err"
fi

for m in qwen3-moe qwen3-dense; do
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
  a=$(timeout 120 $B/corolla generate --device cuda --prompt-ids $prompt --max-tokens 64 --temperature 0 --ignore-eos 2>>"$OUT/generate.err")
  b=$(timeout 120 $B/corolla generate --device cuda --prompt-ids $prompt --max-tokens 64 --temperature 0 --ignore-eos --tp "$TP" 2>>"$OUT/generate.err")
  echo "1 GPU : $a" >>"$OUT/generate.log"; echo "tp$TP  : $b" >>"$OUT/generate.log"
  same=$(python3 -c "import sys; a=sys.argv[1].split(','); b=sys.argv[2].split(','); n=next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), min(len(a),len(b))); print(f'{n}/{len(a)} tokens equal' + (' IDENTICAL' if a==b and len(a)==64 else ''))" "$a" "$b")
  note "demo greedy prompt $prompt tp$TP vs 1 GPU: $same"
done
grep -h -E "error|Check failed" "$OUT/logits.err" "$OUT/generate.err" | head -10

echo "=== summary"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/parallel_bench.log" ] && grep -A12 "^all-reduce latency" "$OUT/parallel_bench.log" | grep -v "NCCL INFO"
