#include "cli/slurm_allocation.h"

#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shardline::cli {
namespace {

absl::StatusOr<int> IntVariable(const GetEnv& getenv, const char* name, int fallback) {
  const char* value = getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  // SLURM writes some counts with a multiplier, e.g. SLURM_CPUS_ON_NODE "2" but
  // SLURM_JOB_CPUS_PER_NODE "2(x2)"; the variables read here are plain numbers.
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < 0) {
    return absl::InvalidArgumentError(std::string("$") + name + " is '" + value + "', not a count");
  }
  return parsed;
}

std::string StringVariable(const GetEnv& getenv, const char* name) {
  const char* value = getenv(name);
  return value ? value : "";
}

}  // namespace

absl::StatusOr<SlurmTask> ReadSlurmTask(const GetEnv& getenv) {
  SlurmTask task;
  task.job_id = StringVariable(getenv, "SLURM_JOB_ID");
  if (task.job_id.empty()) {
    return absl::FailedPreconditionError(
        "not inside a SLURM allocation (no $SLURM_JOB_ID): run `shardline slurm SPEC` from an "
        "sbatch script (examples/slurm/train.sbatch) or an salloc shell");
  }
  task.step_id = StringVariable(getenv, "SLURM_STEP_ID");
  task.node_name = StringVariable(getenv, "SLURMD_NODENAME");
  task.node_list =
      StringVariable(getenv, task.step_id.empty() ? "SLURM_JOB_NODELIST" : "SLURM_STEP_NODELIST");
  if (task.node_list.empty()) task.node_list = StringVariable(getenv, "SLURM_JOB_NODELIST");
  if (task.node_list.empty()) {
    return absl::FailedPreconditionError("SLURM job " + task.job_id +
                                         " has no $SLURM_JOB_NODELIST");
  }
  auto node_index = IntVariable(getenv, "SLURM_NODEID", 0);
  auto step_tasks = IntVariable(getenv, "SLURM_STEP_NUM_TASKS", 0);
  auto step_nodes = IntVariable(getenv, "SLURM_STEP_NUM_NODES", 0);
  auto cpus = IntVariable(getenv, "SLURM_CPUS_ON_NODE", 1);
  auto gpus = IntVariable(getenv, "SLURM_GPUS_ON_NODE", 0);
  for (const auto* parsed : {&node_index, &step_tasks, &step_nodes, &cpus, &gpus}) {
    if (!parsed->ok()) return parsed->status();
  }
  task.node_index = *node_index;
  task.step_tasks = *step_tasks;
  task.step_nodes = *step_nodes;
  task.cpus_on_node = std::max(1, *cpus);
  task.gpus_on_node = *gpus;
  if (!task.step_id.empty() && task.step_tasks != task.step_nodes) {
    return absl::FailedPreconditionError(
        "SLURM step " + task.job_id + "." + task.step_id + " runs " +
        std::to_string(task.step_tasks) + " tasks on " + std::to_string(task.step_nodes) +
        " nodes: `shardline slurm` wants one task per node (srun --ntasks-per-node=1), whose "
        "agent runs one actor per device of the node");
  }
  return task;
}

std::string AllocatedDevices(const SlurmTask& task) {
  if (task.gpus_on_node > 0) return "cuda";
  return "cpu:" + std::to_string(task.cpus_on_node);
}

absl::StatusOr<std::vector<std::string>> ParseHostnames(const std::string& output,
                                                        const std::string& node_list) {
  std::vector<std::string> names;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipWhitespace())) {
    names.emplace_back(absl::StripAsciiWhitespace(line));
  }
  if (names.empty()) {
    return absl::InvalidArgumentError("`scontrol show hostnames " + node_list + "` named no node");
  }
  return names;
}

std::map<std::string, std::string> ParseNodeAddresses(const std::string& output) {
  std::map<std::string, std::string> addresses;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipWhitespace())) {
    std::string name, address;
    for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipWhitespace())) {
      if (absl::ConsumePrefix(&word, "NodeName=")) name = std::string(word);
      if (absl::ConsumePrefix(&word, "NodeAddr=")) address = std::string(word);
    }
    if (!name.empty() && !address.empty()) addresses[name] = address;
  }
  return addresses;
}

}  // namespace shardline::cli
