#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, repository root, gpu-bundle/ carried; build it
# here with scripts/build_gpu.sh): what `corolla serve --graph-warmup` costs and buys on
# Qwen3-30B-A3B random weights. Two servers one after the other, same flags but the warm-up:
#   warm  : waits for the log line of the idle warm-up ("decode graphs: N captured while idle in
#           S s"), reads the GPU memory before and after it, then runs the workload;
#   cold  : --no-graph-warmup, the workload right after /health (each step that needs a graph
#           captures it in line).
# The workload (`corolla bench serve`, its one untimed request first at each concurrency) at
# concurrency 1 and 16 shows what the first requests see: TTFT, TPOT and ITL p50/p99 and the
# largest ITL. Logs under $OUT.
# Env (defaults): COROLLA_BIN (gpu-bundle/corolla), COROLLA_SERVE_CONFIG (qwen3-30b-a3b.json),
# COROLLA_SERVE_ENGINE_FLAGS (--gpu-memory-utilization 0.9), COROLLA_SERVE_WORKLOAD
# (--concurrency 1,16 --num-prompts 2,16 --input-len 512 --output-len 128),
# COROLLA_WARMUP_WAIT (seconds to wait for the warm-up, 300).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
OUT=${OUT:-/tmp/corolla-warmup-out}
mkdir -p "$OUT"
bin=${COROLLA_BIN:-gpu-bundle/corolla}
cfg=${COROLLA_SERVE_CONFIG:-tests/data/configs/qwen3-30b-a3b.json}
read -r -a engine_flags <<<"${COROLLA_SERVE_ENGINE_FLAGS:---gpu-memory-utilization 0.9}"
read -r -a workload <<<"${COROLLA_SERVE_WORKLOAD:---concurrency 1,16 --num-prompts 2,16 --input-len 512 --output-len 128}"
wait_s=${COROLLA_WARMUP_WAIT:-300}
port=${COROLLA_SERVE_PORT:-18610}
if [ ! -x "$bin" ]; then echo "gpu_serve_warmup.sh: $bin missing: run scripts/build_gpu.sh and carry gpu-bundle" >&2; exit 1; fi
health() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; }
mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -1; }
ms() { echo $(($(date +%s%N) / 1000000)); }
since() { printf "%.2f" "$(( $(ms) - $1 ))e-3"; }  # seconds since a ms stamp

rc=0
for mode in warm cold; do
  flags=()
  [ "$mode" = cold ] && flags=(--no-graph-warmup)
  start=$(ms)
  "$bin" serve --device cuda --config "$cfg" --random-weights "${engine_flags[@]}" "${flags[@]}" --port "$port" \
    >"$OUT/serve_$mode.log" 2>&1 &
  server=$!
  for _ in $(seq 1 1200); do health && break; kill -0 "$server" 2>/dev/null || break; sleep 0.25; done
  if ! health; then
    echo "$mode: server did not become healthy"; tail -20 "$OUT/serve_$mode.log"; rc=1
    kill -TERM "$server" 2>/dev/null; wait "$server"
    continue
  fi
  echo "=== $mode: healthy after $(since "$start") s, GPU memory $(mem)"
  if [ "$mode" = warm ]; then
    for _ in $(seq 1 $((wait_s * 4))); do grep -q "captured while idle" "$OUT/serve_$mode.log" && break; sleep 0.25; done
    echo "$mode: $(grep -o 'decode graphs: .*' "$OUT/serve_$mode.log" | tail -1) (seen after $(since "$start") s), GPU memory $(mem)"
  fi
  timeout 600 "$bin" bench serve --url "http://127.0.0.1:$port" "${workload[@]}" --json --no-progress \
    >"$OUT/bench_$mode.jsonl" 2>"$OUT/bench_$mode.err" || { echo "$mode: bench exit $?"; rc=1; }
  echo "$mode: GPU memory after the workload $(mem)"
  kill -TERM "$server" 2>/dev/null
  wait "$server"
  echo "$mode: server exit $?"
done
python3 - "$OUT"/bench_warm.jsonl "$OUT"/bench_cold.jsonl <<'PY'
import json, sys
dec = json.JSONDecoder()
print("| server | concurrency | requests | failed | TTFT p50/p99 ms | TPOT p50/p99 ms | ITL p50/p99/max ms | output tok/s |")
print("|---|---:|---:|---:|---|---|---|---:|")
for path in sys.argv[1:]:
    try: text = open(path).read()
    except OSError: continue
    i = text.find("{")
    while i >= 0:
        r, end = dec.raw_decode(text, i)
        i = text.find("{", end)
        f = lambda k: "%.1f / %.1f" % (r[k]["p50_ms"], r[k]["p99_ms"])
        itl = r["itl"]
        print("| %s | %d | %d | %d | %s | %s | %.1f / %.1f / %s | %.1f |" % (
            "warm" if "warm" in path else "cold", r["concurrency"], r["num_prompts"], r["failed"], f("ttft"),
            f("tpot"), itl["p50_ms"], itl["p99_ms"], "%.1f" % itl["max_ms"] if "max_ms" in itl else "-",
            r["output_throughput"]))
PY
exit $rc
