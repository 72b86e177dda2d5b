#include "worker/actor/layout_wire.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardline::actor {

absl::StatusOr<placement::ParallelSpec> ParallelSpecFromWire(wire::ParallelLayout::Reader layout) {
  placement::ParallelSpec parallel;
  const auto degree = [](uint32_t v) { return static_cast<int>(std::min<uint32_t>(v, 1u << 30)); };
  parallel.tp = degree(layout.getTp());
  parallel.pp = degree(layout.getPp());
  parallel.dp = degree(layout.getDp());
  parallel.zero = degree(layout.getZero());
  parallel.micro_batch =
      static_cast<int64_t>(std::min<uint64_t>(layout.getMicroBatch(), uint64_t{1} << 40));
  for (uint32_t layers : layout.getStageLayers()) parallel.stage_layers.push_back(degree(layers));
  switch (layout.getSchedule()) {
    case wire::PipelineSchedule::ONE_F_ONE_B:
      parallel.schedule = placement::PipelineScheduleKind::k1F1B;
      break;
    case wire::PipelineSchedule::INTERLEAVED:
      parallel.schedule = placement::PipelineScheduleKind::kInterleaved;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown pipeline schedule enumerant ",
                                                     static_cast<int>(layout.getSchedule())));
  }
  parallel.virtual_stages = degree(layout.getVirtualStages());
  switch (layout.getRecompute()) {
    case wire::RecomputeMode::NONE:
      parallel.recompute = placement::RecomputeMode::kNone;
      break;
    case wire::RecomputeMode::SELECTIVE:
      parallel.recompute = placement::RecomputeMode::kSelective;
      break;
    case wire::RecomputeMode::FULL:
      parallel.recompute = placement::RecomputeMode::kFull;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown recompute mode enumerant ",
                                                     static_cast<int>(layout.getRecompute())));
  }
  return parallel;
}

}  // namespace shardline::actor
