// `shardline slurm`'s reading of an allocation (cli/slurm_allocation.h) and its errors where the
// allocation cannot be used, through the binary a user runs. The whole launch on a real SLURM
// cluster is tests/integration/slurm_cluster_test.sh.
#include <gtest/gtest.h>

#include <map>

#include "cli/slurm_allocation.h"
#include "tests/support/cli_process.h"

namespace shardline::cli {
namespace {

using test_support::MakeTestDir;
using test_support::RunShardline;

GetEnv EnvOf(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(SlurmAllocation, ReadsAStepTaskAndItsDevices) {
  auto task = ReadSlurmTask(EnvOf({{"SLURM_JOB_ID", "42"},
                                   {"SLURM_STEP_ID", "0"},
                                   {"SLURM_NODEID", "1"},
                                   {"SLURM_STEP_NUM_TASKS", "2"},
                                   {"SLURM_STEP_NUM_NODES", "2"},
                                   {"SLURM_STEP_NODELIST", "gpu[07-08]"},
                                   {"SLURM_JOB_NODELIST", "gpu[07-09]"},
                                   {"SLURMD_NODENAME", "gpu08"},
                                   {"SLURM_CPUS_ON_NODE", "16"}}));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->job_id, "42");
  EXPECT_EQ(task->node_index, 1);
  EXPECT_EQ(task->node_list, "gpu[07-08]");  // the step's nodes, not the whole allocation's
  EXPECT_EQ(task->node_name, "gpu08");
  EXPECT_EQ(AllocatedDevices(*task), "cpu:16");
  task->gpus_on_node = 8;
  EXPECT_EQ(AllocatedDevices(*task), "cuda");
}

TEST(SlurmAllocation, TheBatchScriptIsNotAStep) {
  auto task = ReadSlurmTask(EnvOf({{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "n1"}}));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_TRUE(task->step_id.empty());
  EXPECT_EQ(task->node_list, "n1");
}

TEST(SlurmAllocation, RefusesWhatItCannotUse) {
  auto outside = ReadSlurmTask(EnvOf({}));
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("not inside a SLURM allocation"), std::string::npos);

  auto two_per_node = ReadSlurmTask(EnvOf({{"SLURM_JOB_ID", "7"},
                                           {"SLURM_STEP_ID", "0"},
                                           {"SLURM_JOB_NODELIST", "n[1-2]"},
                                           {"SLURM_STEP_NUM_TASKS", "4"},
                                           {"SLURM_STEP_NUM_NODES", "2"}}));
  ASSERT_FALSE(two_per_node.ok());
  EXPECT_NE(two_per_node.status().message().find("--ntasks-per-node=1"), std::string::npos)
      << two_per_node.status();

  auto bad_count = ReadSlurmTask(EnvOf(
      {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n1"}, {"SLURM_CPUS_ON_NODE", "2(x3)"}}));
  ASSERT_FALSE(bad_count.ok());
  EXPECT_NE(bad_count.status().message().find("$SLURM_CPUS_ON_NODE is '2(x3)'"), std::string::npos)
      << bad_count.status();
}

TEST(SlurmAllocation, ParsesScontrolOutput) {
  auto names = ParseHostnames("node1\nnode2\n\n", "node[1-2]");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"node1", "node2"}));
  EXPECT_FALSE(ParseHostnames("\n", "node[1-2]").ok());

  const auto addresses = ParseNodeAddresses(
      "NodeName=node2 Arch=x86_64 CoresPerSocket=2 NodeAddr=10.1.2.3 NodeHostName=node2 "
      "Version=22.05.8\nNodeName=node3 NodeAddr=node3 NodeHostName=node3\n");
  EXPECT_EQ(addresses.at("node2"), "10.1.2.3");
  EXPECT_EQ(addresses.at("node3"), "node3");
}

TEST(SlurmCommand, OutsideAnAllocationSaysSo) {
  const std::string dir = MakeTestDir("cli_slurm");
  auto run = RunShardline({"slurm", "spec.yaml"}, dir + "/out.log", std::chrono::seconds(30),
                          {{"SLURM_JOB_ID", ""}});
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.out.find("not inside a SLURM allocation"), std::string::npos) << run.out;
}

// A node list nothing can expand (no scontrol on PATH) is an error naming it, never a cluster of
// one on localhost; the other nodes are told and do not wait out their deadline.
TEST(SlurmCommand, NoScontrolIsAnErrorNotLocalhost) {
  const std::string dir = MakeTestDir("cli_slurm");
  const std::vector<std::pair<std::string, std::string>> step = {{"SLURM_JOB_ID", "9"},
                                                                 {"SLURM_STEP_ID", "0"},
                                                                 {"SLURM_STEP_NUM_TASKS", "2"},
                                                                 {"SLURM_STEP_NUM_NODES", "2"},
                                                                 {"SLURM_STEP_NODELIST", "n[1-2]"},
                                                                 {"SLURMD_NODENAME", "n1"},
                                                                 {"PATH", dir + "/empty"},
                                                                 {"HOME", dir}};
  auto first_env = step;
  first_env.emplace_back("SLURM_NODEID", "0");
  auto second_env = step;
  second_env.emplace_back("SLURM_NODEID", "1");

  SpawnOptions second;
  second.argv = {test_support::ShardlineBinary(), "slurm", "spec.yaml", "--start-timeout-s", "60"};
  second.extra_env = second_env;
  second.log_path = dir + "/second.log";
  auto second_pid = Spawn(second);
  ASSERT_TRUE(second_pid.ok()) << second_pid.status();

  auto first =
      RunShardline({"slurm", "spec.yaml"}, dir + "/first.log", std::chrono::seconds(30), first_env);
  EXPECT_EQ(first.exit_code, 1) << first.out;
  EXPECT_NE(first.out.find("cannot expand the allocation's node list 'n[1-2]'"), std::string::npos)
      << first.out;
  EXPECT_NE(first.out.find("`scontrol` is not on $PATH"), std::string::npos) << first.out;

  auto second_exit = WaitFor(*second_pid, std::chrono::seconds(20));
  ASSERT_TRUE(second_exit.ok() && second_exit->has_value())
      << "the second node still waits: " << test_support::ReadWholeFile(dir + "/second.log");
  EXPECT_EQ((*second_exit)->code, 1);
  const std::string second_out = test_support::ReadWholeFile(dir + "/second.log");
  EXPECT_NE(second_out.find("the first node failed"), std::string::npos) << second_out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/.shardline/slurm/9.0"))
      << "the rendezvous directory was left behind";
}

}  // namespace
}  // namespace shardline::cli
