// A piece of a model's training state as a checkpoint stores it: a box of a global tensor, the
// parameter's own or one of its AdamW moments' (which have the parameter's global shape). A model
// lists the pieces it saves (ShardedGpt::StatePieces), copies their values into a
// staging buffer in that order, and loads them back by boxes from any plan's checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/box.h"
#include "checkpoint/train_state.h"
#include "model/model_config.h"

namespace shardline::model {

struct StatePiece {
  checkpoint::StateKind kind = checkpoint::StateKind::kParam;
  std::string param;                  // the parameter's global name ("h.3.fc.w")
  std::vector<int64_t> global_shape;  // the checkpoint's view (qkv.w as (3, C, C))
  checkpoint::Box box;                // in global_shape
  int64_t numel = 0;
};

}  // namespace shardline::model
