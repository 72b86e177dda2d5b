#include "coordinator/layout_wire.h"

namespace shardline::coordinator {

void FillParallelLayout(const placement::ParallelSpec& parallel,
                        wire::ParallelLayout::Builder out) {
  out.setTp(static_cast<uint32_t>(parallel.tp));
  out.setPp(static_cast<uint32_t>(parallel.pp));
  out.setDp(static_cast<uint32_t>(parallel.dp));
  out.setZero(static_cast<uint32_t>(parallel.zero));
  out.setMicroBatch(static_cast<uint64_t>(parallel.micro_batch));
  auto stages = out.initStageLayers(static_cast<unsigned>(parallel.stage_layers.size()));
  for (size_t i = 0; i < parallel.stage_layers.size(); ++i) {
    stages.set(static_cast<unsigned>(i), static_cast<uint32_t>(parallel.stage_layers[i]));
  }
  switch (parallel.schedule) {
    case placement::PipelineScheduleKind::k1F1B:
      out.setSchedule(wire::PipelineSchedule::ONE_F_ONE_B);
      break;
    case placement::PipelineScheduleKind::kInterleaved:
      out.setSchedule(wire::PipelineSchedule::INTERLEAVED);
      break;
  }
  out.setVirtualStages(static_cast<uint32_t>(parallel.virtual_stages));
  switch (parallel.recompute) {
    case placement::RecomputeMode::kNone:
      out.setRecompute(wire::RecomputeMode::NONE);
      break;
    case placement::RecomputeMode::kSelective:
      out.setRecompute(wire::RecomputeMode::SELECTIVE);
      break;
    case placement::RecomputeMode::kFull:
      out.setRecompute(wire::RecomputeMode::FULL);
      break;
  }
}

}  // namespace shardline::coordinator
