// The expert-sorted order of a batch's (token, slot) pairs (moe_permute.cu), shared by the bf16
// and FP8 routed experts (moe.cu, moe_fp8.cu): on the device, with no host read of the counts.
// Internal to the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace corolla::cuda {

// The most experts MoePermute sorts into (its histograms live in shared memory).
constexpr int kMoePermuteMaxExperts = 1024;

struct MoePermutation {
  int32_t* offsets;     // [E + 1]: expert e's rows are [offsets[e], offsets[e + 1])
  int32_t* perm_token;  // [TK]: the token of each expert-sorted row (rows past offsets[E] unset)
  int32_t* slot_row;    // [TK]: the row of each (token, slot) pair, -1 where its id is skipped
  int32_t* active;  // [E + 1] or null: the experts with rows, in id order; active[E] = their number
};

// The ints of device scratch MoePermute needs for `pairs` pairs over `experts` experts.
int64_t MoePermuteScratchInts(int64_t pairs, int experts);

// Sorts the pairs of ids [tokens, top_k] i32 (row stride ids_stride, device) by expert into
// `out`; ids outside [0, experts) (another rank's experts, -1) are skipped. Up to
// Tuning().moe_permute_one_cta_max_pairs pairs in one CTA, more in three launches (a histogram
// per chunk of 2048 pairs, a scan, then each chunk places its pairs).
// The order of an expert's rows is unspecified (each row is computed alone and combined
// through slot_row).
void MoePermute(const int32_t* ids, int64_t ids_stride, int64_t tokens, int top_k, int experts,
                const MoePermutation& out, int32_t* scratch, cudaStream_t s);

}  // namespace corolla::cuda
