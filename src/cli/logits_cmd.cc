// corolla logits: float32 logits of every position of one or more token sequences, to safetensors.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "cli/commands.h"
#include "cli/data_parallel.h"
#include "cli/model_options.h"
#include "engine/model_runner.h"
#include "model/safetensors.h"
#include "parallel/launcher.h"

namespace corolla::cli {
namespace {

// "1,2,3;4,5" -> {{1,2,3}, {4,5}}.
Result<std::vector<std::vector<int32_t>>> ParseSequences(const std::string& text) {
  std::vector<std::vector<int32_t>> seqs;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ';')) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIdList(item));
    seqs.push_back(std::move(ids));
  }
  if (seqs.empty()) return InvalidArgument("empty --ids");
  return seqs;
}

// How BatchLogits runs the sequences.
struct LogitsOptions {
  int chunk = 0;  // > 0: prefill in steps of at most this many tokens per sequence (1: decode); 0: one step
  DType linear_state_dtype = DType::kF32;
};

// Logits [sum of lengths, vocab] (host f32) of every position of `seqs`, rows in sequence
// order, from a prefill of all of them together (one step, or chunks of opts.chunk) through a
// KV cache of their own (eager: no decode graphs, whose warm-up forwards would break the ranks'
// lockstep under DP-EP).
Result<Tensor> BatchLogits(Model& model, Backend& backend, const std::vector<std::vector<int32_t>>& seqs,
                           const LogitsOptions& opts) {
  const ModelConfig& config = model.config();
  constexpr int kBlockSize = 16;
  int num_blocks = 0;
  for (const auto& ids : seqs) {
    RETURN_IF_ERROR(CheckTokenIds(config, ids));
    num_blocks += static_cast<int>((ids.size() + kBlockSize - 1) / kBlockSize);
  }
  const int num_seqs = static_cast<int>(seqs.size());
  KvCache kv(backend, model.kv_cache_spec(), num_blocks, kBlockSize,
             model.state_spec().WithRecurrentDtype(opts.linear_state_dtype), num_seqs);
  ModelRunner runner(model, backend, kv, DecodeGraphMode::kOff);
  std::vector<Sequence> s(num_seqs);
  std::vector<int64_t> first_row(num_seqs, 0);  // of each sequence in the output
  int64_t total = 0;
  int next_block = 0;
  for (int i = 0; i < num_seqs; ++i) {
    s[i].tokens = seqs[i];
    s[i].num_prompt_tokens = s[i].num_tokens();
    while (static_cast<int>(s[i].block_table.size()) * kBlockSize < s[i].num_tokens())
      s[i].block_table.push_back(next_block++);
    s[i].state_slot = kv.AllocateStateSlot();
    first_row[i] = total;
    total += s[i].num_tokens();
  }
  const int64_t vocab = config.vocab_size;
  Tensor all = Tensor::Empty(DType::kF32, {total, vocab});
  for (;;) {
    std::vector<ScheduledChunk> chunks;
    for (Sequence& seq : s)
      if (seq.num_uncomputed() > 0)
        chunks.push_back({&seq, opts.chunk > 0 ? std::min(opts.chunk, seq.num_uncomputed()) : seq.num_uncomputed()});
    if (chunks.empty()) break;
    Tensor logits = LogitsToHost(backend, runner.Execute(chunks, /*all_logits=*/true));  // rows in chunk order
    int64_t row = 0;
    for (const ScheduledChunk& c : chunks) {
      const int64_t dst = first_row[c.seq - s.data()] + c.seq->num_computed_tokens;
      std::memcpy(all.ptr<float>() + dst * vocab, logits.ptr<float>() + row * vocab, c.num_tokens * vocab * sizeof(float));
      row += c.num_tokens;
      c.seq->num_computed_tokens += c.num_tokens;
    }
  }
  return all;
}

// This rank's sequences through the model (an empty forward when it has none), then every
// rank's rows gathered and put back in input order: logits [sum of lengths, vocab].
Result<Tensor> DataParallelLogits(LoadedModel& m, const std::vector<std::vector<int32_t>>& seqs,
                                  const LogitsOptions& opts) {
  const std::vector<int> mine = SequencesOfThisRank(static_cast<int>(seqs.size()), m);
  const int64_t vocab = m.model->config().vocab_size;
  std::string blob;
  if (mine.empty()) {
    RunEmptyForward(*m.model, m);
  } else {
    std::vector<std::vector<int32_t>> my_seqs;
    for (int i : mine) my_seqs.push_back(seqs[i]);
    ASSIGN_OR_RETURN(Tensor rows, BatchLogits(*m.model, *m.backend, my_seqs, opts));
    if (!IsDataParallel(m)) return rows;
    blob.assign(static_cast<const char*>(rows.view().data), rows.view().nbytes());
  }
  ASSIGN_OR_RETURN(std::vector<std::string> parts, GatherFromDpRanks(m, blob));
  int64_t total = 0;
  for (const auto& ids : seqs) total += static_cast<int64_t>(ids.size());
  Tensor all = Tensor::Empty(DType::kF32, {total, vocab});
  std::vector<size_t> read(parts.size(), 0);  // bytes of each rank's part used so far
  int64_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const size_t owner = i % parts.size(), bytes = seqs[i].size() * vocab * sizeof(float);
    if (read[owner] + bytes > parts[owner].size())
      return Internal("DP rank " + std::to_string(owner) + " sent too few logits");
    std::memcpy(all.ptr<float>() + row * vocab, parts[owner].data() + read[owner], bytes);
    read[owner] += bytes;
    row += static_cast<int64_t>(seqs[i].size());
  }
  return all;
}

}  // namespace

int LogitsMain(int argc, char** argv) {
  ModelOptions model;
  std::string ids_text, out_path;
  int64_t chunk = 0;
  Flags flags("logits",
              "Runs one prefill over --ids (or chunks of --chunk tokens) and writes the float32\n"
              "logits of every position to --out as a safetensors file with one tensor, 'logits',\n"
              "of shape [L, vocab]. Several sequences (--ids 1,2,3;4,5) run as one batch: 'logits'\n"
              "holds their rows one after the other, and 'seq_lens' [N] i32 their lengths. With\n"
              "--dp D each rank takes every D-th sequence; the file is the same.");
  model.Declare(flags);
  flags.String("ids", &ids_text, "token ids, comma-separated, e.g. 1,2,3; sequences separated by ';'");
  flags.String("out", &out_path, "output .safetensors file");
  flags.Int("chunk", &chunk,
            "prefill in steps of at most N tokens per sequence (1: token by token, as decoding does); "
            "0: one step");
  bool help = false;
  Status s = flags.Parse(argc, argv, 2, &help);
  if (help) return 0;
  if (s.ok() && ids_text.empty()) s = InvalidArgument("--ids is required");
  if (s.ok() && out_path.empty()) s = InvalidArgument("--out is required");
  if (s.ok() && chunk < 0) s = InvalidArgument("--chunk must not be negative");
  // DP-EP ranks step in lockstep; their sequences, hence their numbers of chunks, differ.
  if (s.ok() && chunk > 0 && model.dp > 1) s = InvalidArgument("--chunk with --dp > 1 is not supported");
  Result<DType> state_dtype = model.LinearStateDtype();
  if (s.ok() && !state_dtype.ok()) s = state_dtype.status();
  if (!s.ok()) return ReportStatus("logits", s);
  if (std::optional<int> rc = SpawnLocalRanks(model.world_size(), argc, argv)) return *rc;
  const LogitsOptions opts{static_cast<int>(chunk), *state_dtype};
  s = [&]() -> Status {
    ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> seqs, ParseSequences(ids_text));
    ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromOptions(model));
    ASSIGN_OR_RETURN(Tensor logits, DataParallelLogits(m, seqs, opts));
    if (!m.is_output_rank()) return Status::Ok();  // rank 0 writes the (gathered or replicated) logits
    if (seqs.size() == 1) return WriteSafetensors(out_path, {{"logits", logits.view()}});
    Tensor lens = Tensor::Empty(DType::kI32, {static_cast<int64_t>(seqs.size())});
    for (size_t i = 0; i < seqs.size(); ++i) lens.ptr<int32_t>()[i] = static_cast<int32_t>(seqs[i].size());
    return WriteSafetensors(out_path, {{"logits", logits.view()}, {"seq_lens", lens.view()}});
  }();
  return ReportStatus("logits", s);
}

}  // namespace corolla::cli
