// Measurement hooks of the persistent decode kernel (decode_stack.cu; the op itself is declared
// in ops.h): the ring probe (decode_stack_probe.cu) and the routing sink (decode_stack.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace corolla::cuda {

// GB/s that one CTA an SM pulls from `src` (`bytes`, device memory) through `stages` shared
// stages of `stage_bytes`, each filled by `copies` bulk copies (cp.async.bulk) from as many
// producer lanes, the consumer only waiting and freeing: the decode stack's weight-ring ceiling.
double DecodeStackStreamProbe(const void* src, int64_t bytes, int stage_bytes, int stages,
                              int copies, cudaStream_t s);

// Tests: where each launch of the persistent kernel writes every layer's router logits
// ([layers][E] f32, as producer B of CTA 0 read them) and chosen ids ([layers][top_k] i32), both
// device memory; null (the default) writes nothing. Process-wide, like Tuning().
struct DecodeStackRouteSink {
  float* logits = nullptr;
  int32_t* ids = nullptr;
};
void SetDecodeStackRouteSink(const DecodeStackRouteSink& sink);

}  // namespace corolla::cuda
