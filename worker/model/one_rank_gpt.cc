#include "worker/model/one_rank_gpt.h"

#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/box.h"
#include "common/status_macros.h"
#include "worker/model/paged_inference.h"

namespace shardline::model {

absl::StatusOr<std::unique_ptr<OneRankGpt>> OneRankGpt::Create(const OneRankOptions& options,
                                                               kernels::Backend& backend) {
  RETURN_IF_ERROR(options.config.Validate());
  RETURN_IF_ERROR(options.config.EngineSupports());
  if (options.batch < 1 || options.micro_batch < 0 ||
      (options.micro_batch > 0 && options.batch % options.micro_batch != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", options.batch,
                                                   " is not a positive multiple of micro_batch ",
                                                   options.micro_batch));
  }
  ShardedOptions sharded;
  sharded.config = options.config;
  sharded.parallel.micro_batch = options.micro_batch > 0 ? options.micro_batch : options.batch;
  sharded.parallel.recompute = options.recompute;
  sharded.global_batch = options.batch;
  sharded.seq_len = options.seq_len;
  sharded.adamw = options.adamw;
  ASSIGN_OR_RETURN(std::unique_ptr<ShardedGpt> gpt,
                   ShardedGpt::Create(sharded, ShardedGroups{}, backend));
  return std::unique_ptr<OneRankGpt>(new OneRankGpt(options, std::move(gpt)));
}

absl::Status OneRankGpt::InitGpt2(uint64_t seed) { return gpt_->InitGpt2(seed); }

absl::Status OneRankGpt::Load(const ModelParams& params) {
  if (params.layout().total() != ParamLayout(options_.config).total()) {
    return absl::InvalidArgumentError(absl::StrCat("parameters of ", params.config().DebugString(),
                                                   " for a model of ",
                                                   options_.config.DebugString()));
  }
  return gpt_->LoadState(ModelBoxReader(params), /*with_moments=*/false);
}

absl::StatusOr<StepStats> OneRankGpt::Step(std::span<const int32_t> tokens,
                                           std::span<const int32_t> targets, int64_t step,
                                           float learning_rate) {
  const size_t n = static_cast<size_t>(options_.batch) * static_cast<size_t>(options_.seq_len);
  if (tokens.size() != n || targets.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(tokens.size(), " tokens and ", targets.size(),
                                                   " targets for a batch of ", options_.batch,
                                                   " x ", options_.seq_len));
  }
  const size_t T = static_cast<size_t>(options_.seq_len);
  const MicroBatchSource source = [&](int64_t first, int64_t count, std::vector<int32_t>& in,
                                      std::vector<int32_t>& out) {
    in.assign(tokens.begin() + first * T, tokens.begin() + (first + count) * T);
    out.assign(targets.begin() + first * T, targets.begin() + (first + count) * T);
    return absl::OkStatus();
  };
  return gpt_->TrainStep(source, step, learning_rate);
}

absl::StatusOr<OneRankGpt::State> OneRankGpt::TrainingState() const {
  ASSIGN_OR_RETURN(ModelParams params, ModelParams::Zeros(options_.config));
  ASSIGN_OR_RETURN(ModelParams exp_avg, ModelParams::Zeros(options_.config));
  ASSIGN_OR_RETURN(ModelParams exp_avg_sq, ModelParams::Zeros(options_.config));
  const std::vector<StatePiece> pieces = gpt_->StatePieces();
  int64_t total = 0;
  for (const StatePiece& piece : pieces) total += piece.numel;
  std::vector<float> staged(static_cast<size_t>(total));
  RETURN_IF_ERROR(gpt_->CopyState(staged));
  // On one rank the pieces cover every tensor exactly once: each is a box of its tensor's global
  // view, which is the tensor's own row-major memory.
  int64_t at = 0;
  for (const StatePiece& piece : pieces) {
    ModelParams& into = piece.kind == checkpoint::StateKind::kParam    ? params
                        : piece.kind == checkpoint::StateKind::kExpAvg ? exp_avg
                                                                       : exp_avg_sq;
    ASSIGN_OR_RETURN(std::span<float> tensor, into.Tensor(piece.param));
    const std::vector<int64_t> origin(piece.global_shape.size(), 0);
    checkpoint::CopyBoxOverlap(
        checkpoint::SafetensorsDType::kF32, reinterpret_cast<const std::byte*>(staged.data() + at),
        piece.box.offsets, piece.box.shape, origin, piece.global_shape, tensor.data());
    at += piece.numel;
  }
  return State{std::move(params), std::move(exp_avg), std::move(exp_avg_sq)};
}

absl::StatusOr<ModelParams> OneRankGpt::Params() const {
  ASSIGN_OR_RETURN(State state, TrainingState());
  return std::move(state.params);
}

}  // namespace shardline::model
