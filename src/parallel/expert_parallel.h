// Expert parallelism. Rank r of an EP group of `ep` ranks holds experts [r * E/ep, (r+1) * E/ep)
// of every MoE layer (model/qwen3.cc loads only those). Two layouts use those shards:
//  - TP-EP (prefill): every rank holds the same tokens, routes all of them, runs the (token,
//    slot) pairs of its own experts (ToLocalExpertIds), and one all-reduce sums the ranks' parts.
//  - DP-EP (decode): every rank owns its tokens. An EpExchange sends each token to the ranks
//    that own its selected experts (once per rank, with that rank's local ids and weights),
//    those run MoeExperts on what they received, and the partial outputs come back to be summed
//    in token order. Ranks may bring different numbers of tokens, zero included.
// Supported: up to kMaxEpRanks ranks; on CUDA, bf16 activations with hidden % 8 == 0.
// An EpExchange belongs to one model and is used by the thread that runs it.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "parallel/communicator.h"
#include "parallel/ep_row_layout.h"

namespace corolla {

// topk_ids [T, K] i32 += -first_expert in place, on the backend's device and stream: ids of this
// rank's experts become local indices in [0, num_local), the others fall outside it and
// Backend::MoeExperts skips them.
void ToLocalExpertIds(Backend& backend, const TensorView& topk_ids, int first_expert);

// --- DP-EP ------------------------------------------------------------------------------

// What this rank's experts must run in one MoE layer: views into the exchange's receive
// buffer, valid until Combine. Ids of other ranks' experts, and of padding rows, lie outside
// [0, E_local), so Backend::MoeExperts over these views does exactly this rank's share.
struct ExpertInputs {
  TensorView x;             // [R, H] activation dtype (rows strided by the row layout)
  TensorView topk_ids;      // [R, K] i32 local expert ids
  TensorView topk_weights;  // [R, K] f32
  int64_t rows() const { return x.dim(0); }
};

// How tokens reach the experts' ranks and come back. Both calls are collective over the EP
// group: every rank makes them once per MoE layer, in the same order, with any number of
// tokens (a rank with none still joins, so the others' exchanges complete).
// AllToAllEpExchange does it with the Communicator's all-to-alls (NCCL send/recv, or the host);
// fused NVLink kernels on NCCL's device API (pack + put into peers' symmetric windows, as
// DeepEP's low-latency mode) are meant to be a second implementation of this interface.
class EpExchange {
 public:
  virtual ~EpExchange() = default;
  // x [T, H] activations, topk_ids [T, K] i32 global expert ids, topk_weights [T, K] f32.
  virtual ExpertInputs Dispatch(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights) = 0;
  // expert_out [R, H] (contiguous): this rank's weighted expert sum for each received row.
  // Writes out [T, H] (the T of the last Dispatch): each token's partials from the ranks it
  // went to, summed in rank order in f32.
  virtual void Combine(const TensorView& expert_out, const TensorView& out) = 0;
  // Exchanges made with both a fixed capacity and a sized fallback (EpExchangeConfig::
  // sized_fallback): which one the next forward's Dispatch / Combine calls take (a model calls
  // this at the top of each forward, from ForwardBatch::ep_fixed_capacity). Others ignore it.
  virtual void SelectFixedCapacity(bool fixed) { (void)fixed; }
};

struct EpExchangeConfig {
  int num_experts = 0;  // E of the whole group (a multiple of the group size)
  // Most tokens any rank brings to one step. > 0: every exchange moves fixed blocks of
  // `capacity` rows per peer, with no host synchronisation (CUDA-graph capturable); a step with
  // more tokens is an error. 0: per-peer row counts are exchanged first and read on the host
  // (one synchronisation per exchange), and only real rows travel.
  int capacity = 0;
  // With capacity > 0: also keep a sized exchange, taken while SelectFixedCapacity(false) (the
  // default). Every rank must select the same one before each forward.
  bool sized_fallback = false;
};

std::unique_ptr<EpExchange> MakeAllToAllEpExchange(Backend& backend, Communicator& comm, const EpExchangeConfig& config);

// The exchange a DP-EP model uses. COROLLA_EP_EXCHANGE=auto (default): on CUDA with a fixed
// capacity of at most kNvlExchangeMaxCapacity rows, the NVLink exchange on NCCL's device API
// (parallel/cuda/nvl_ep_exchange.h; NCCL's all-to-all if it cannot be set up), else the
// all-to-all one; =alltoall or =nvl force one. Collective over `comm`. hidden and top_k size
// the NVLink exchange's windows.
//
// DP x TP (tp_size > 1): the tp ranks of a DP replica hold the same tokens (the activations are
// replicated after each TP all-reduce). TP rank r then dispatches only its rows,
// TpRowsOfRank(T, tp_size, r), and Combine writes those rows of out and zeros in the others, so
// the caller's TP all-reduce (which also sums the shared expert's partial outputs) gives every
// TP rank all T rows. config.capacity is then the most tokens a replica brings; each rank's
// exchange moves ceil(capacity / tp_size) rows per peer.
constexpr int kNvlExchangeMaxCapacity = 1024;
Result<std::unique_ptr<EpExchange>> MakeEpExchange(Backend& backend, Communicator& comm, const EpExchangeConfig& config,
                                                   int64_t hidden, int top_k, int tp_size = 1, int tp_rank = 0);

// Rows [begin, end) of a replica's `tokens` that TP rank `tp_rank` of `tp_size` dispatches:
// ceil(tokens / tp_size) each in rank order, fewer (or none) at the end.
struct RowRange {
  int64_t begin = 0, end = 0;
};
RowRange TpRowsOfRank(int64_t tokens, int tp_size, int tp_rank);

// DP-EP models: whether the shared expert runs on the backend's side stream while the routed
// tokens are exchanged (Backend::RunOnSideStream). On unless COROLLA_SHARED_EXPERT_OVERLAP=0.
bool OverlapSharedExpert();

// The steps of AllToAllEpExchange on the tensors' device (plain loops on the CPU, kernels in
// parallel/cuda/ep_kernels.cu on CUDA); public for tests. A destination rank's block of rows
// starts at r * capacity, or (capacity 0) after the rows of ranks before it.
// Plan: map [T, ep] i32 = row of token t within rank r's block (tokens in order), or -1 when
// none of its experts is on r; counts [ep] i32 = rows for each rank.
void PlanEpRoutes(Backend& backend, const TensorView& topk_ids, int experts_per_rank, const TensorView& map,
                  const TensorView& counts);
// Pack: send [rows, row_bytes] u8 gets each routed token's row (layout from x and topk_ids); with
// a capacity, the unused rows of each block get ids -1.
void PackEpRows(Backend& backend, const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                const TensorView& map, const TensorView& counts, int capacity, int experts_per_rank,
                const TensorView& send);
// Combine: out[t] = sum over r in order of back[block(r) + map[t, r]], f32 accumulation.
void CombineEpRows(Backend& backend, const TensorView& back, const TensorView& map, const TensorView& counts,
                   int capacity, const TensorView& out);

}  // namespace corolla
