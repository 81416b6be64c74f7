#!/usr/bin/env bash
# Builds the libFuzzer harnesses (src/**/*_fuzz.cc) with clang and ASan/UBSan, and runs each for
# a bounded time: scripts/fuzz.sh [seconds per target, default 30]. Not part of CI (which runs
# the seeded random mutators inside the unit tests); use it before changing a parser.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
out=build-fuzz
mkdir -p "$out"
cxx=$(command -v clang++-14 || command -v clang++)
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -Isrc)
common=(src/base/status.cc src/base/check.cc src/tensor/tensor.cc src/tensor/dtype.cc)

build() {  # name harness sources... [-- link flags]
  local name=$1
  shift
  echo "fuzz: building $name"
  "$cxx" "${flags[@]}" "$@" "${common[@]}" -o "$out/$name"
}

build safetensors_fuzz src/model/safetensors_fuzz.cc src/model/safetensors.cc
sources_of() { ls "$@" | grep -v -E '_(test|fuzz)\.cc$'; }
if [ -f src/tokenizer/jinja/template_fuzz.cc ]; then
  # shellcheck disable=SC2046
  build template_fuzz src/tokenizer/jinja/template_fuzz.cc $(sources_of src/tokenizer/jinja/*.cc)
fi
if [ -f src/tokenizer/tokenizer_fuzz.cc ]; then
  tok_srcs=$(sources_of src/tokenizer/*.cc src/tokenizer/jinja/*.cc)
  # shellcheck disable=SC2086
  build tokenizer_fuzz src/tokenizer/tokenizer_fuzz.cc $tok_srcs $(pkg-config --libs libpcre2-8) -lutf8proc
fi
if [ -f src/server/request_fuzz.cc ]; then
  req_srcs=$(sources_of src/server/openai_protocol.cc src/tokenizer/*.cc src/tokenizer/jinja/*.cc)
  # shellcheck disable=SC2086
  build request_fuzz src/server/request_fuzz.cc $req_srcs $(pkg-config --libs libpcre2-8) -lutf8proc
  # its seeds: request bodies of the kinds the server takes
  mkdir -p "$out/corpus_request_fuzz"
  printf '%s' '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}' >"$out/corpus_request_fuzz/chat"
  printf '%s' '{"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"1"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"chat_template_kwargs":{"enable_thinking":false}}' >"$out/corpus_request_fuzz/tools"
  printf '%s' '{"prompt":[1,2,3],"echo":true,"logprobs":2,"stop":["x"],"seed":3}' >"$out/corpus_request_fuzz/completion"
fi

for f in "$out"/*_fuzz; do
  [ -f "$f" ] && [ -x "$f" ] || continue  # (the corpus_*_fuzz folders of earlier runs)
  name=$(basename "$f")
  mkdir -p "$out/corpus_$name"
  echo "fuzz: running $name for ${seconds}s"
  "$f" -max_total_time="$seconds" -max_len=65536 "$out/corpus_$name" 2>&1 | tail -n 3
done
