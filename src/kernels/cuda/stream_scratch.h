// Device scratch that the kernels of one stream share across launches: arrival counters that the
// last arriving CTA (or warp) re-arms, and the buffers that go with them. Zeroed in stream order
// on the stream's first use of a slot and kept for the process's life; streams running at once
// get their own, so they must not share a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace corolla::cuda {

enum class StreamScratchSlot {
  kSplitKvMergeCounters,  // split_kv_merge.cuh
  kStagedRouter,          // router.cu: the staged router's arrival counter and logits
  kStagedGemvNorm,        // gemv.cu: RmsNormLinear's arrival counter
  kAttentionRegion,       // attention_decode.cu: the folded o projection's two counters
  kMoePreviousPicks,      // moe_decode.cu: each layer's batch-1 picks of the last forward
  kMoePredictedPicks,     // moe_decode.h: o_proj's predicted batch-1 logits, picks and count
};

// `bytes` of zeroed device memory for (stream, slot); every call for a slot must ask for the same
// size. Null when the first use would be inside a stream capture (the zeroing would only run at
// replay): the caller then takes a path without it.
void* StreamScratch(cudaStream_t s, StreamScratchSlot slot, size_t bytes);

}  // namespace corolla::cuda
