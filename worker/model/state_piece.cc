#include "worker/model/state_piece.h"

#include "worker/model/shard_layout.h"

namespace shardline::model {

std::vector<StatePiece> WholeModelPieces(const ModelConfig& config) {
  // A one-rank cut is the whole model in ParamLayout order, with the checkpoint's views.
  const ShardPlace whole{1, 0, {{0, static_cast<int>(config.layers)}}, true, true};
  const absl::StatusOr<ShardLayout> layout = ShardLayout::Create(config, whole);
  std::vector<StatePiece> pieces;
  if (!layout.ok()) return pieces;
  for (const checkpoint::StateKind kind :
       {checkpoint::StateKind::kParam, checkpoint::StateKind::kExpAvg,
        checkpoint::StateKind::kExpAvgSq}) {
    for (const ShardTensor& t : layout->tensors()) {
      pieces.push_back(StatePiece{kind, t.name, t.global_shape,
                                  checkpoint::Box{t.box_offsets, t.box_shape}, t.numel});
    }
  }
  return pieces;
}

}  // namespace shardline::model
