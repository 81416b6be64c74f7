#!/usr/bin/env bash
# One command from a fresh machine to the main job: installs, builds, and runs the built-in model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/corolla generate --chat "What is 7 + 5?" \
  --max-tokens 32 --temperature 0 "$@"
