#!/usr/bin/env bash
# Runs on the GPU machine (it has cuobjdump; this one does not): the size of each kernel's code
# (its .text section in the binary's cubins), largest first, demangled where c++filt is there.
# Why it matters: code an SM's instruction caches do not hold runs from L2 at about half the
# speed (CudaPerf.ColdCode; docs/benchmarks/single-gpu-sessions-37-46.md, "Session 37").
# Usage: scripts/gpu_code_sizes.sh [BINARY (gpu-bundle/corolla)] [REGEX: only matching kernels]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_env.sh
bin=${1:-gpu-bundle/corolla}
cuobjdump -elf "$bin" | python3 -c '
import re, subprocess, sys
rows = []
for line in sys.stdin:  # section headers: index, offset, size, ..., name last
    f = line.split()
    if len(f) > 4 and f[-1].startswith(".text.") and re.fullmatch(r"[0-9a-f]+", f[2]) and int(f[2], 16):
        rows.append((int(f[2], 16), f[-1][len(".text."):]))
rows.sort(reverse=True)
try:
    names = subprocess.run(["c++filt"], input="\n".join(n for _, n in rows), capture_output=True,
                           text=True).stdout.split("\n")
except OSError:
    names = [n for _, n in rows]
pattern = re.compile(sys.argv[1]) if len(sys.argv) > 1 else None
print("%d kernels, %d KB of code" % (len(rows), sum(s for s, _ in rows) // 1024))
for (size, raw), name in zip(rows, names):
    name = re.sub(r"corolla::(cuda::)?(\(anonymous namespace\)::)?", "", name or raw)
    if pattern is None or pattern.search(name): print("%8d %s" % (size, name[:160]))
' ${2:+"$2"}
