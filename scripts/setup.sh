#!/usr/bin/env bash
# Installs the Debian packages Corolla builds and tests with. Idempotent: installs only what is
# missing. Needs root (or sudo) when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git curl ca-certificates
  libopenblas-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libboost-dev
  libgtest-dev libgmock-dev clang libclang-rt-dev
)
# Node.js runs the OpenAI-client test and the tokenizer peer benchmark; machines that carry
# their own build (nodesource bundles npm) keep it, others take Debian's.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
