#include "placement/checkpoint_state.h"

#include <algorithm>

#include "checkpoint/model_config.h"

namespace shardline::placement {

checkpoint::TrainState CheckpointTrainStateOf(const TrainSpec& spec) {
  checkpoint::TrainState train;
  train.seed = spec.seed;
  train.batch = spec.batch;
  train.seq_len = spec.seq_len;
  if (!spec.data.per_site.empty()) {
    // Each site's tokens are its own: the identity is the list of files (no checksum of one).
    train.data.source = "per_site";
    for (const std::string& file : spec.data.per_site) {
      train.data.path += (train.data.path.empty() ? "" : ", ") + file;
    }
  } else if (spec.data.path.empty()) {
    train.data.source = "synthetic";
    train.data.synthetic_seed = spec.data.synthetic_seed;
    train.data.synthetic_bytes = spec.data.synthetic_bytes;
  } else {
    train.data.source = "file";
    train.data.path = spec.data.path;
  }
  train.steps = spec.steps;
  const OptimizerSpec& o = spec.optimizer;
  train.optimizer = {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.grad_clip, o.warmup_steps};
  return train;
}

checkpoint::PlanInfo CheckpointPlanOf(const TrainSpec& spec, const ParallelSpec& parallel) {
  checkpoint::PlanInfo plan;
  plan.tp = parallel.tp;
  plan.pp = parallel.pp;
  plan.dp = parallel.dp;
  plan.zero = parallel.zero;
  plan.micro_batch = MicroBatchSize(parallel, spec.batch);
  if (auto stages = StagesOf(parallel, static_cast<int>(spec.model.layers)); stages.ok()) {
    for (const StageRange& stage : *stages) plan.stage_layers.push_back(stage.size());
  }
  plan.device = spec.device == TrainDevice::kCuda ? "cuda" : "cpu";
  plan.precision = spec.precision == TrainPrecision::kBFloat16 ? "bf16" : "fp32";
  plan.schedule = std::string(PipelineScheduleName(parallel.schedule));
  plan.virtual_stages = parallel.virtual_stages;
  plan.recompute = std::string(RecomputeModeName(parallel.recompute));
  return plan;
}

checkpoint::StepHeader CheckpointStepHeader(const TrainSpec& spec, const ParallelSpec& parallel,
                                            int64_t step, int64_t world_size,
                                            const checkpoint::DataIdentity& data) {
  checkpoint::StepHeader header;
  header.step = step;
  header.world_size = world_size;
  header.metadata = checkpoint::ModelMetadata(spec.model);
  header.train = CheckpointTrainStateOf(spec);
  // The source is the spec's; what the loaded stream was, the loader's.
  header.train.data.tokens = data.tokens;
  header.train.data.xxh3 = data.xxh3;
  header.plan = CheckpointPlanOf(spec, parallel);
  return header;
}

checkpoint::ResumeRequest ResumeRequestOf(const CheckpointSpec& checkpoint) {
  checkpoint::ResumeRequest request;
  request.dir = checkpoint.dir;
  request.mode = checkpoint.resume;
  request.path = checkpoint.resume_path;
  return request;
}

int64_t MemoryStepBytesPerRank(int64_t params, const ParallelSpec& parallel, bool diloco,
                               int64_t replicas) {
  const int64_t model_parallel = std::max(1, parallel.tp * parallel.pp);
  const int64_t dp = std::max(1, parallel.dp);
  const int64_t part = (params + model_parallel - 1) / model_parallel;  // floats
  const int64_t shard = (part + dp - 1) / dp;
  const int64_t held_params = parallel.zero >= 3 || diloco ? shard : part;
  const int64_t held_moments = 2 * (parallel.zero >= 1 || diloco ? shard : part);
  return kMemoryStepsKept * (1 + replicas) * 4 * (held_params + held_moments);
}

}  // namespace shardline::placement
