// What a checkpoint records of a spec (checkpoint/train_state.h): the model config, the train
// settings a resumed run must keep, and the plan. The coordinator and both trainers describe a run
// through these, so that a step written by one is checked against the spec of another the same way.
#pragma once

#include "checkpoint/commit.h"
#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/resume.h"
#include "checkpoint/train_state.h"
#include "placement/parallel_layout.h"
#include "placement/train_spec.h"

namespace shardline::placement {

// The data's identity from the spec alone: its tokens are known only once it is loaded (0 here).
checkpoint::TrainState CheckpointTrainStateOf(const TrainSpec& spec);
// `parallel` as resolved for the run (the single-device trainer passes the default: one rank),
// with its micro-batch and stage split made explicit; the device and precision from `spec`.
checkpoint::PlanInfo CheckpointPlanOf(const TrainSpec& spec, const ParallelSpec& parallel);
// Everything a step's manifest says besides its tensors: the model's metadata, the train section
// (the data's source from the spec, its tokens and their checksum from `data`, what the loaders
// saw) and the plan, for step `step` of a run of `world_size` ranks.
checkpoint::StepHeader CheckpointStepHeader(const TrainSpec& spec, const ParallelSpec& parallel,
                                            int64_t step, int64_t world_size,
                                            const checkpoint::DataIdentity& data);
// Where the run resumes from, for checkpoint::DecideResume.
checkpoint::ResumeRequest ResumeRequestOf(const CheckpointSpec& checkpoint);

// Memory steps (checkpoint.memory_interval): a node keeps kMemoryStepsKept of them at once (a
// rank removes a step two intervals older than the one it starts: a slower rank may still be
// writing the previous one, so the one before it may be the newest committed).
inline constexpr int kMemoryStepsKept = 3;
// The host memory memory steps take on a rank's node for that rank: kMemoryStepsKept copies of
// the training state it holds (ShardedGpt::Share::kHeld: fp32 parameters and both AdamW moments,
// 4 bytes each a parameter, whole over its tensor- and pipeline-parallel part except what ZeRO
// shards over the data-parallel ranks: the moments from stage 1, the parameters at 3; DiLoCo's
// sites hold a share), and as much again for the buddy's copy it holds with `replicas`.
int64_t MemoryStepBytesPerRank(int64_t params, const ParallelSpec& parallel, bool diloco,
                               int64_t replicas);

}  // namespace shardline::placement
