#!/usr/bin/env bash
# One command from a fresh machine to the main job: installs, builds, and serves the built-in
# model on http://127.0.0.1:8000 (OpenAI API). Extra arguments go to `corolla serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/corolla serve "$@"
