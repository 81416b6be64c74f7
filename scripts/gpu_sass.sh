#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`; its image has cuobjdump, this one has none):
# dumps the SASS of the kernels in BINARY whose mangled names match REGEX into $OUT (one file a
# kernel) and prints each one's instruction count, so that two builds can be compared:
#   bash scripts/gpu_sass.sh gpu-bundle/corolla 'AttentionDecodeKernelILi128ELi1ELb0ELb1'
# Carry the binaries (stripped ones keep their device code).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BINARY REGEX" >&2
  exit 2
fi
bin=$1 regex=$2
OUT=${OUT:-/tmp/corolla-sass}
mkdir -p "$OUT"
command -v cuobjdump >/dev/null || PATH=/usr/local/cuda/bin:$PATH
names=$(cuobjdump --list-elf "$bin" >/dev/null 2>&1 && cuobjdump --dump-sass "$bin" | grep -oE "Function : [^ ]+" |
        awk '{print $3}' | grep -E "$regex" | sort -u || true)
if [ -z "$names" ]; then
  echo "no kernel of $bin matches $regex" >&2
  exit 1
fi
tag=$(basename "$bin")
for f in $names; do
  out="$OUT/${tag}.$(echo "$f" | md5sum | cut -c1-8).sass"
  cuobjdump --dump-sass --function "$f" "$bin" >"$out"
  echo "$f: $(grep -cE '^\s+/\*[0-9a-f]{4,}\*/' "$out") instructions -> $out"
done
