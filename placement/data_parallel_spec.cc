#include "placement/data_parallel_spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "placement/string_view_compat.h"

namespace shardline::placement {

std::string_view GradientCompressionName(GradientCompression compression) {
  switch (compression) {
    case GradientCompression::kNone:
      return "none";
    case GradientCompression::kPowerSgd:
      return "powersgd";
    case GradientCompression::kInt8:
      return "int8";
  }
  return "none";
}

std::string_view DataParallelSyncName(DataParallelSync sync) {
  return sync == DataParallelSync::kDiloco ? "diloco" : "every_step";
}

std::string DataParallelSuffix(const DataParallelSpec& spec) {
  if (spec.diloco()) {
    return absl::StrCat(
        ", diloco every ", spec.every,
        spec.fragments > 1 ? absl::StrCat(" (", spec.fragments, " fragments)") : "");
  }
  if (spec.compression == GradientCompression::kPowerSgd) {
    return absl::StrCat(", powersgd rank ", spec.rank);
  }
  if (spec.compression == GradientCompression::kInt8) return ", int8";
  return "";
}

int64_t SmallestGradientMatrixDimension(const model::ModelConfig& model, int tp) {
  const int64_t t = std::max(tp, 1);
  const int64_t hd = model.head_size();
  // Per rank: the column-parallel outputs (query heads, the MLP's hidden columns, the vocabulary
  // rows) are cut by tp; a rank holds at least one key/value head; the row-parallel inputs are
  // the same widths, and d_model is never cut.
  int64_t smallest =
      std::min({model.d_model, model.heads * hd / t, std::max(hd, model.kv() * hd / t),
                model.ff() / t, (model.vocab + t - 1) / t});
  if (model.positions == model::PositionKind::kLearned) {
    smallest = std::min(smallest, model.max_seq_len);
  }
  return std::max<int64_t>(smallest, 1);
}

absl::Status CheckDataParallel(const DataParallelSpec& spec, const ParallelSpec& layout,
                               const model::ModelConfig& model) {
  const auto refuse = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("data_parallel.", parts...));
  };
  const absl::string_view compression = AbslView(GradientCompressionName(spec.compression));
  if (layout.dp == 1 && spec.compressed()) {
    return refuse("compression: ", compression,
                  " needs data parallelism, but dp is 1 (there is no gradient to reduce)");
  }
  if (layout.dp == 1 && spec.diloco()) {
    return refuse("sync: diloco needs data parallelism (a replica per site), but dp is 1");
  }
  if (spec.diloco()) {
    if (layout.zero != 0) {
      return refuse("sync: diloco needs zero 0, but parallel.zero is ", layout.zero,
                    ": ZeRO shards state across the data-parallel ranks, which are DiLoCo's "
                    "sites, so every inner step would cross sites");
    }
    if (spec.compressed()) {
      return refuse("compression: ", compression,
                    " compresses every step's gradients, but sync: diloco exchanges no "
                    "gradients (only each outer step's parameter change)");
    }
    if (spec.every < 1) return refuse("every: ", spec.every, " must be at least 1");
    if (spec.fragments < 1 || spec.fragments > model.layers) {
      return refuse("fragments: ", spec.fragments, " must be 1 to the model's ", model.layers,
                    " layers");
    }
    if (spec.fragments > spec.every) {
      return refuse("fragments: ", spec.fragments, " is more than every: ", spec.every,
                    ": each fragment needs an inner step of its own to sync on");
    }
  }
  if (spec.compressed() && layout.zero >= 2) {
    return refuse("compression: ", compression, " needs zero 0 or 1, but parallel.zero is ",
                  layout.zero, ": stages 2 and 3 reduce-scatter the gradients");
  }
  if (spec.compression == GradientCompression::kPowerSgd) {
    const int64_t smallest = SmallestGradientMatrixDimension(model, layout.tp);
    if (spec.rank < 1 || spec.rank > smallest) {
      return refuse("rank: ", spec.rank, " must be 1 to ", smallest,
                    ", the smallest dimension of a rank's gradient matrices at tp ", layout.tp);
    }
  }
  return absl::OkStatus();
}

}  // namespace shardline::placement
