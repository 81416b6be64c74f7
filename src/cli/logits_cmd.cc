// corolla logits: float32 logits of every position of a token sequence, to safetensors.
#include <cstdio>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "engine/model_runner.h"
#include "model/safetensors.h"
#include "parallel/launcher.h"

namespace corolla::cli {

int LogitsMain(int argc, char** argv) {
  ModelOptions model;
  std::string ids_text, out_path;
  Flags flags("logits",
              "Runs one prefill over --ids and writes the float32 logits of every position to\n"
              "--out as a safetensors file with one tensor, 'logits', of shape [L, vocab].");
  model.Declare(flags);
  flags.String("ids", &ids_text, "token ids, comma-separated, e.g. 1,2,3");
  flags.String("out", &out_path, "output .safetensors file");
  bool help = false;
  Status s = flags.Parse(argc, argv, 2, &help);
  if (help) return 0;
  if (s.ok() && ids_text.empty()) s = InvalidArgument("--ids is required");
  if (s.ok() && out_path.empty()) s = InvalidArgument("--out is required");
  if (!s.ok()) return ReportStatus("logits", s);
  if (std::optional<int> rc = SpawnLocalRanks(static_cast<int>(model.tp), argc, argv)) return *rc;
  s = [&]() -> Status {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIdList(ids_text));
    ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromOptions(model));
    ASSIGN_OR_RETURN(Tensor logits, ComputeLogits(*m.model, *m.backend, ids));
    if (!m.is_output_rank()) return Status::Ok();  // logits are replicated; rank 0 writes them
    return WriteSafetensors(out_path, {{"logits", logits.view()}});
  }();
  return ReportStatus("logits", s);
}

}  // namespace corolla::cli
