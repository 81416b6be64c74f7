#!/usr/bin/env python3
"""Peer benchmark for `corolla bench tokenize`: Hugging Face's Rust `tokenizers` on the same
texts, single-threaded (RAYON_NUM_THREADS=1, one encode call per text, as requests arrive).

usage: python3 scripts/bench_tokenize_hf.py --tokenizer DIR --text GENERATED.txt
  GENERATED.txt comes from `corolla bench tokenize --write-text FILE`, so both encode the
  same bytes; token counts are printed to cross-check.
"""
import argparse
import json
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--golden-dir", default="tests/data/tokenizer-golden")
    ap.add_argument("--golden-repeats", type=int, default=20)
    args = ap.parse_args()

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    load = time.perf_counter() - t0
    golden = []
    for name in ("qwen3.json", "deepseek_v3.json"):
        with open(os.path.join(args.golden_dir, name), encoding="utf-8") as f:
            golden += [c["text"] for c in json.load(f)["cases"]]
    big = open(args.text, "rb").read().decode("utf-8")

    nbytes = ntok = 0
    t0 = time.perf_counter()
    for _ in range(args.golden_repeats):
        for text in golden:
            ntok += len(tok.encode(text, add_special_tokens=False).ids)
            nbytes += len(text.encode("utf-8"))
    golden_s = time.perf_counter() - t0

    # Same 4 KB chunks cut at newlines as the C++ benchmark.
    chunks, rest = [], big.encode("utf-8")
    while rest:
        cut = len(rest) if len(rest) <= 4096 else rest.find(b"\n", 4096)
        if cut < 0:
            cut = len(rest)
        chunks.append(rest[:cut].decode("utf-8"))
        rest = rest[cut:]
    big_tok = 0
    t0 = time.perf_counter()
    for c in chunks:
        big_tok += len(tok.encode(c, add_special_tokens=False).ids)
    big_s = time.perf_counter() - t0
    size = len(big.encode("utf-8"))
    print(f"hf tokenizers bench: {args.tokenizer} (load {load:.2f} s), single thread")
    print(f"  golden corpus: {len(golden)} texts x {args.golden_repeats} passes, {nbytes / 1e6:.2f} MB, "
          f"{ntok} tokens: {nbytes / 1e6 / golden_s:.1f} MB/s")
    print(f"  generated text ({size} bytes) in {len(chunks)} chunks, {big_tok} tokens: {size / 1e6 / big_s:.1f} MB/s")


if __name__ == "__main__":
    main()
