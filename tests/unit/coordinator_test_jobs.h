// Jobs and nodes for the unit tests of the coordinator's parts: a train job parsed from a real
// spec (elastic or not), CPU nodes registered in a Membership, and a generation laid out on
// them, as the coordinator would have them. No sockets, no clock but the one passed in.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "coordinator/job.h"
#include "coordinator/membership.h"
#include "coordinator/scheduler.h"
#include "placement/parallel_layout.h"

namespace shardline::coordinator::testing {

// A small train job; `extra` is appended to the spec (parallel:, elastic:, checkpoint:, ...).
inline std::string TrainSpecYaml(const std::string& extra) {
  return "name: t\nkind: train\ndevices: cpu\n"
         "model: {layers: 2, heads: 4, d_model: 32, max_seq_len: 32}\n"
         "data: {synthetic: {seed: 1, bytes: 64KiB}}\n"
         "steps: 40\nbatch: 8\nseq_len: 32\nseed: 1\nlog_interval: 5\n" +
         extra;
}

inline Job MakeJob(const std::string& extra, const std::string& id = "t-1",
                   const std::string& work_dir = "/tmp") {
  Job job;
  job.id = id;
  job.spec_yaml = TrainSpecYaml(extra);
  job.spec_dir = job.work_dir = work_dir;
  auto spec = placement::ParseJobSpec(job.spec_yaml, "test spec", {work_dir, work_dir});
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (spec.ok()) job.spec = *spec;
  job.backend = "gloo";
  if (job.spec.parallel_auto) job.auto_max_actors = AutoMaxActors(job.spec);
  job.train.saving_dir = ResolveUnder(work_dir, job.spec.train.checkpoint.dir);
  return job;
}

inline NodeInfo CpuNode(const std::string& id, int devices, const std::string& instance = "i1") {
  NodeInfo node;
  node.node_id = id;
  node.instance_id = instance;
  node.address = "10.0.0.1";
  for (int d = 0; d < devices; ++d) {
    DeviceInfo device;
    device.kind = DeviceInfo::Kind::kCpu;
    device.index = d;
    device.memory_bytes = uint64_t{8} << 30;
    device.name = "cpu";
    node.devices.push_back(device);
  }
  return node;
}

// Generation `generation` as a fault ended it: `kind` by `rank` on `node` at `step`.
inline GenerationRecord FaultEnded(uint32_t generation, FaultKind kind, int rank = -1,
                                   const std::string& node = "", int64_t step = -1,
                                   const std::string& detail = "") {
  GenerationRecord record;
  record.generation = generation;
  record.ending = Ending::kFault;
  Fault cause;
  cause.kind = kind;
  cause.rank = rank;
  cause.node = node;
  cause.step = step;
  cause.detail = detail;
  record.cause = cause;
  return record;
}

// The job's generation `generation` running on `placement`: actors, groups of its layout, one
// generation record, as StartGeneration leaves it (phase kSpawning).
inline void LayOut(Job& job, const Placement& placement, TimePoint now, uint32_t generation = 1) {
  job.state = JobState::kRunning;
  job.phase = Phase::kSpawning;
  job.generation = generation;
  job.generation_started = now;
  job.bootstrap_deadline = now + job.spec.bootstrap_timeout;
  job.run_deadline = now + job.spec.run_timeout;
  job.actors.clear();
  job.groups.clear();
  for (size_t rank = 0; rank < placement.size(); ++rank) {
    ActorRecord actor;
    actor.rank = static_cast<int>(rank);
    actor.node_id = placement[rank].first;
    actor.device.index = placement[rank].second;
    job.actors.push_back(actor);
  }
  const auto& p = job.spec.parallel;
  auto grid = placement::RankGrid::Create(p.tp, p.pp, p.dp);
  EXPECT_TRUE(grid.ok()) << grid.status();
  if (grid.ok()) {
    for (auto& group : grid->AllGroups()) {
      GroupRecord record;
      record.kind = group.kind;
      record.id = group.id;
      record.ranks = group.ranks;
      job.groups.push_back(std::move(record));
    }
  }
  GenerationRecord record;
  record.generation = generation;
  record.world = static_cast<int>(placement.size());
  record.resumed_step = record.last_step = job.train.resumed_step;
  job.generations.push_back(record);
}

}  // namespace shardline::coordinator::testing
