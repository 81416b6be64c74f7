#!/usr/bin/env bash
# One command from a fresh machine to the main job: installs, builds, and runs the built-in model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/corolla generate --prompt-ids 1,282,201,320,286,223,25,333,223,23,33,2,201,1,281,201 \
  --max-tokens 32 --temperature 0 "$@"
