#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`, repository root, gpu-bundle/ carried; build it
# here with scripts/build_gpu.sh): the serving benchmark of issue 5 on Qwen3-30B-A3B random
# weights. Starts `corolla serve --random-weights` in the background, waits for /health, runs
# `corolla bench serve` over HTTP at each concurrency, stops the server, then runs the same
# workload (same prompts: run i uses seed + i) on an Engine in one process (--in-process) with the
# same engine settings, and prints a table: output tokens/s, TTFT/TPOT/ITL, HTTP / engine.
# Logs and JSON lines under $OUT. Env (defaults): COROLLA_SERVE_CONFIG (qwen3-30b-a3b.json),
# COROLLA_SERVE_LAYERS (0: all), COROLLA_SERVE_DEVICE (cuda), COROLLA_SERVE_INPUT_LEN (1024),
# COROLLA_SERVE_OUTPUT_LEN (1024), COROLLA_SERVE_CONCURRENCY (1,16,64,256),
# COROLLA_SERVE_PROMPTS (4,16,64,256), COROLLA_SERVE_PHASE_TIMEOUT (seconds per phase, 600),
# COROLLA_SERVE_ENGINE_FLAGS (--max-num-seqs 256 --max-batch-tokens 2048 --gpu-memory-utilization 0.9),
# COROLLA_SERVE_SAMPLING (empty: greedy; e.g. "--temperature 0.6 --top-k 20 --top-p 0.95": the
# values of Qwen3's generation_config, which `corolla serve` gives a request that names none).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
OUT=${OUT:-/tmp/corolla-serve-out}
mkdir -p "$OUT"

bin=${COROLLA_BIN:-gpu-bundle/corolla}
cfg=${COROLLA_SERVE_CONFIG:-tests/data/configs/qwen3-30b-a3b.json}
layers=${COROLLA_SERVE_LAYERS:-0}
device=${COROLLA_SERVE_DEVICE:-cuda}
input_len=${COROLLA_SERVE_INPUT_LEN:-1024}
output_len=${COROLLA_SERVE_OUTPUT_LEN:-1024}
concurrency=${COROLLA_SERVE_CONCURRENCY:-1,16,64,256}
prompts=${COROLLA_SERVE_PROMPTS:-4,16,64,256}
phase_timeout=${COROLLA_SERVE_PHASE_TIMEOUT:-600}
port=${COROLLA_SERVE_PORT:-18600}
read -r -a engine_flags <<<"${COROLLA_SERVE_ENGINE_FLAGS:---max-num-seqs 256 --max-batch-tokens 2048 --gpu-memory-utilization 0.9}"
model=(--device "$device" --config "$cfg" --random-weights --layers "$layers")
read -r -a sampling <<<"${COROLLA_SERVE_SAMPLING:-}"
workload=(--concurrency "$concurrency" --num-prompts "$prompts" --input-len "$input_len" --output-len "$output_len"
          --warmup-prompts 1 --json --no-progress ${sampling[@]+"${sampling[@]}"})

if [ ! -x "$bin" ]; then echo "gpu_serve_bench.sh: $bin missing: run scripts/build_gpu.sh and carry gpu-bundle" >&2; exit 1; fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
fi
echo "commit: ${COROLLA_COMMIT:-unknown}; $(date -u +%FT%TZ)" | tee -a "$OUT/gpu.txt"

health() {
  if command -v curl >/dev/null; then curl -fs "http://127.0.0.1:$port/health" >/dev/null
  else python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; fi
}

rc=0
start=$(date +%s)
echo "=== serve (${model[*]} ${engine_flags[*]})"
"$bin" serve "${model[@]}" "${engine_flags[@]}" --port "$port" >"$OUT/serve.log" 2>&1 &
server=$!
for _ in $(seq 1 600); do
  health && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.5
done
if health; then
  echo "server ready after $(($(date +%s) - start)) s"; grep -E "random weights|KV cache|serving model" "$OUT/serve.log"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed 's/^/GPU memory in use: /'
  echo "=== bench serve over HTTP (${workload[*]})"
  timeout "$phase_timeout" "$bin" bench serve --url "http://127.0.0.1:$port" "${workload[@]}" \
    >"$OUT/http.jsonl" 2>"$OUT/http.err" || { echo "http bench exit $?"; rc=1; }
else
  echo "server did not become healthy"; tail -20 "$OUT/serve.log"; rc=1
fi
kill -TERM "$server" 2>/dev/null
wait "$server"
echo "server exit $? after $(($(date +%s) - start)) s"

echo "=== bench serve --in-process (same workload, same engine settings)"
timeout "$phase_timeout" "$bin" bench serve --in-process "${model[@]}" "${engine_flags[@]}" "${workload[@]}" \
  >"$OUT/engine.jsonl" 2>"$OUT/engine.err" || { echo "in-process bench exit $?"; rc=1; }
grep -E "random weights|gpu-memory" "$OUT/engine.err"
echo "done after $(($(date +%s) - start)) s"

python3 - "$OUT/http.jsonl" "$OUT/engine.jsonl" <<'EOF' | tee "$OUT/summary.md"
import json, sys
def load(path):
    # JSON lines (several runs) or one indented object (a single run).
    runs, dec = {}, json.JSONDecoder()
    try:
        text = open(path).read()
    except OSError:
        return runs
    i = text.find("{")
    while i >= 0:
        r, end = dec.raw_decode(text, i)
        runs[r["concurrency"]] = r
        i = text.find("{", end)
    return runs
http, eng = load(sys.argv[1]), load(sys.argv[2])
lat = lambda r, k: "%.1f / %.1f / %.1f" % (r[k]["p50_ms"], r[k]["p90_ms"], r[k]["p99_ms"])
print("| concurrency | requests | failed | HTTP output tok/s | engine output tok/s | HTTP / engine | "
      "TTFT p50/p90/p99 ms HTTP | TTFT ms engine | TPOT p50/p90/p99 ms HTTP | TPOT ms engine | "
      "ITL p50/p90/p99 ms HTTP | ITL ms engine |")
print("|---:|---:|---:|---:|---:|---:|---|---|---|---|---|---|")
for c in sorted(set(http) | set(eng)):
    h, e = http.get(c), eng.get(c)
    cell = lambda r, f: f(r) if r else "-"
    ratio = "%.3f" % (h["output_throughput"] / e["output_throughput"]) if h and e and e["output_throughput"] else "-"
    print("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        c, cell(h or e, lambda r: str(r["num_prompts"])),
        cell(h, lambda r: str(r["failed"])) + " / " + cell(e, lambda r: str(r["failed"])),
        cell(h, lambda r: "%.1f" % r["output_throughput"]), cell(e, lambda r: "%.1f" % r["output_throughput"]), ratio,
        cell(h, lambda r: lat(r, "ttft")), cell(e, lambda r: lat(r, "ttft")),
        cell(h, lambda r: lat(r, "tpot")), cell(e, lambda r: lat(r, "tpot")),
        cell(h, lambda r: lat(r, "itl")), cell(e, lambda r: lat(r, "itl"))))
for name, runs in (("http", http), ("engine", eng)):
    for c, r in sorted(runs.items()):
        for err in r.get("errors", []): print("%s c=%d error: %s" % (name, c, err))
EOF
exit $rc
