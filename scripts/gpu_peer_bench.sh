#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, from the repository root, mgpu-bundle/ or
# gpu-bundle/ carried): corolla's decode sweep and prompts on Qwen3-30B-A3B random weights, then
# issue 4's named peer, Hugging Face transformers eager in bf16 (scripts/bench_hf_transformers.py,
# the torch venv the machine has), on the same GPU in the same call, and a summary of both (the
# ratios are the tokens/s lines of the two). Logs: $OUT/peer_{decode,prefill,hf}.log.
#   PEER_BATCHES   corolla's decode batches (default 1,8,32,64,128,256; configs whose KV does not
#                  fit the GPU are skipped by the bench itself)
#   PEER_CONTEXTS  (default 1024,8192); PEER_PREFILL prompt lengths (default 1024,8192; none: skip)
#   PEER_HF_BATCHES  the peer's batches (default "1 64", the issue's), at the first context
#   PEER_CONFIG    (default tests/data/configs/qwen3-30b-a3b.json)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_env.sh
OUT=${OUT:-/tmp/corolla-gpu-out}
mkdir -p "$OUT"
unpack_bundle || exit 1
cfg=${PEER_CONFIG:-tests/data/configs/qwen3-30b-a3b.json}
contexts=${PEER_CONTEXTS:-1024,8192}
prefill=${PEER_PREFILL:-1024,8192}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
rc=0
gpu-bundle/corolla bench decode --config "$cfg" --random-weights --device cuda \
  --batch "${PEER_BATCHES:-1,8,32,64,128,256}" --context "$contexts" --steps 10 \
  >"$OUT/peer_decode.log" 2>&1 || rc=1
if [ "$prefill" != none ]; then
  gpu-bundle/corolla bench prefill --config "$cfg" --random-weights --device cuda \
    --context "$prefill" --steps 3 >"$OUT/peer_prefill.log" 2>&1 || rc=1
fi
/opt/torch/.venv/bin/python scripts/bench_hf_transformers.py --config "$cfg" \
  --batch ${PEER_HF_BATCHES:-1 64} --context "${contexts%%,*}" >"$OUT/peer_hf.log" 2>&1 || rc=1

echo "=== corolla decode (graph lines; the limit and floor per config)"
grep -E "^[a-z].*batch|limit|floor|^ +graph|skipped|rror" "$OUT/peer_decode.log"
echo "=== corolla prefill"
grep -E "peak|ms|rror" "$OUT/peer_prefill.log" 2>/dev/null | head -20
echo "=== transformers"
grep -v Warning "$OUT/peer_hf.log" | tail -12
exit $rc
