// What a SLURM allocation tells a `shardline slurm` task, read from its environment and from
// `scontrol`'s output. No I/O here: cli/slurm.cc runs the commands and passes their text in.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline::cli {

struct SlurmTask {
  std::string job_id;
  // Empty in the batch script or an salloc shell (not yet inside `srun`); `shardline slurm` then
  // starts the step itself.
  std::string step_id;
  int node_index = 0;     // SLURM_NODEID: 0 runs the coordinator
  int step_tasks = 0;     // SLURM_STEP_NUM_TASKS
  int step_nodes = 0;     // SLURM_STEP_NUM_NODES
  std::string node_list;  // SLURM_STEP_NODELIST in a step, else SLURM_JOB_NODELIST
  std::string node_name;  // SLURMD_NODENAME: this node's name in slurm.conf
  int cpus_on_node = 0;   // SLURM_CPUS_ON_NODE
  int gpus_on_node = 0;   // SLURM_GPUS_ON_NODE
};

using GetEnv = std::function<const char*(const char*)>;

// Errors: outside an allocation (no SLURM_JOB_ID), a step that runs more than one task per node,
// a malformed number; each names the variable.
absl::StatusOr<SlurmTask> ReadSlurmTask(const GetEnv& getenv);

// The agent's --devices for this node: its GPUs when the allocation gave it some (the agent
// sees those CUDA_VISIBLE_DEVICES names), else one CPU device per allocated CPU.
std::string AllocatedDevices(const SlurmTask& task);

// `scontrol show hostnames LIST`'s output: one name per line. Errors when it names none.
absl::StatusOr<std::vector<std::string>> ParseHostnames(const std::string& output,
                                                        const std::string& node_list);

// NodeName → NodeAddr from `scontrol show node -o NAMES` (one node per line, KEY=VALUE words).
std::map<std::string, std::string> ParseNodeAddresses(const std::string& output);

}  // namespace shardline::cli
