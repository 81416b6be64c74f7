// The key ranges of split-KV attention: which keys each split of a sequence reads. Shared by every
// kernel that splits a sequence's keys over CTAs (attention.cu, attention_mma.cu,
// attention_decode.cu, mla_decode.cu, decode_stack.cu) and by host tests: plain C++ where nvcc
// does not compile it.
#pragma once

#ifdef __CUDACC__
#define COROLLA_HOST_DEVICE __host__ __device__
#else
#define COROLLA_HOST_DEVICE
#endif

namespace corolla::cuda {

// The keys [begin, end) split `split` of `num_splits` reads of a sequence of seq_len keys, in
// whole `align`-key tiles, end clipped to `limit` (the keys the CTA may see: seq_len for decode).
// Each split takes c = ceil(tiles / num_splits) tiles and the last the remainder where that leaves
// no split empty, as it always does on a plan made for the sequence's own length. On a plan made
// for a longer bucket (the engine's decode graphs plan on their context bucket) such chunks would
// leave the last splits without keys; there the tiles are dealt out as evenly as they go (the
// first tiles % num_splits splits take one more): c at most again, and every CTA has keys. On an
// H200 (Qwen3-30B-A3B, batch 1, the 2048 bucket's 16 splits, session 27): 1100 keys 2.381-2.383
// vs 2.469-2.473 ms a step, 1152 2.382-2.390 vs 2.467-2.475; the engine's ITL at 1025-1280 keys
// fell with it and the greedy argmax (sampling.cu) by 0.084-0.118 ms. Dealing evenly on every
// plan measured the same on buckets but lost on the exact plan at 1152 (2.404-2.408 vs
// 2.386-2.400). Empty when begin >= end.
struct KeyRange {
  int begin, end;
};
COROLLA_HOST_DEVICE inline KeyRange SplitKeyRange(int seq_len, int num_splits, int split, int align,
                                                  int limit) {
  if (num_splits <= 1) return {0, limit};
  const int tiles = (seq_len + align - 1) / align, chunk = (tiles + num_splits - 1) / num_splits;
  int first, count;  // in tiles
  if (chunk * (num_splits - 1) < tiles) {
    first = split * chunk;
    count = split < num_splits - 1 ? chunk : tiles - first;
  } else {
    const int base = tiles / num_splits, extra = tiles % num_splits;
    first = split * base + (split < extra ? split : extra);
    count = base + (split < extra ? 1 : 0);
  }
  const int end = (first + count) * align;
  return {first * align, end < limit ? end : limit};
}

}  // namespace corolla::cuda
