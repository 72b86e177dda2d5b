// `shardline up` end to end, as a user runs it: the real binary, its real children.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "tests/integration/local_cluster.h"

namespace shardline::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// Pids of live processes whose command line mentions `needle`.
// Live processes whose command line holds every one of `needles`.
std::vector<pid_t> ProcessesMentioning(std::initializer_list<std::string> needles) {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bool all = true;
    for (const std::string& needle : needles) {
      all = all && cmdline.find(needle) != std::string::npos;
    }
    if (all && ProcessAlive(std::stoi(name))) found.push_back(std::stoi(name));
  }
  return found;
}
std::vector<pid_t> ProcessesMentioning(const std::string& needle) {
  return ProcessesMentioning({needle});
}

TEST(UpTest, DefaultJobRunsToTheEndAndShutsDownCleanly) {
  const std::string work_dir = fs::temp_directory_path() / ("shardline-up-test-" + std::to_string(getpid()));
  auto result = RunShardline({"up", "--work-dir", work_dir, "--keep"}, 900s);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // One actor per core, 4 or 2 (cli/commands.h's DefaultUpDevices): this process's affinity is
  // what the command inherits.
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int devices = CPU_COUNT(&set) >= 4 ? 4 : 2;
  EXPECT_NE(result.output.find("with " + std::to_string(devices) + " CPU devices"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("succeeded"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("Done in"), std::string::npos) << result.output;
  // The default job trains a Llama over tp=2 × pp=2 (tp=2 on 2 devices) on the Jargon File to the
  // end, its loss falling from ln 257 ≈ 5.55 (uniform over bytes) to under the text's unigram
  // byte entropy (about 3.1 nats: what a model that learnt no context would reach), and commits its
  // final checkpoint.
  EXPECT_NE(result.output.find(devices == 4 ? "plan tp 2 x pp 2 x dp 1" : "plan tp 2 x pp 1 x dp 1"),
            std::string::npos)
      << result.output;
  const size_t last = result.output.rfind("step 600/600  loss ");
  ASSERT_NE(last, std::string::npos) << result.output;
  const double final_loss = std::stod(result.output.substr(last + 19, 8));
  EXPECT_LT(final_loss, 2.4) << result.output;
  EXPECT_NE(result.output.find("checkpoint: step 600 in"), std::string::npos) << result.output;
  // ... and ends with a sample generated from that checkpoint: mostly words of the book.
  const size_t sample = result.output.find("A sample from the trained model");
  ASSERT_NE(sample, std::string::npos) << result.output;
  const size_t text = result.output.find("\n  The hacker ", sample);
  ASSERT_NE(text, std::string::npos) << result.output;
  std::ifstream book_file(SourceDir() + "/examples/data/jargon-file.txt");
  const std::string book((std::istreambuf_iterator<char>(book_file)), {});
  ASSERT_FALSE(book.empty());
  int words = 0, known = 0;
  std::istringstream sampled(result.output.substr(text + 3, 110));
  for (std::string word; sampled >> word;) {
    while (!word.empty() && !std::isalpha(static_cast<unsigned char>(word.back()))) word.pop_back();
    if (word.size() < 2) continue;
    ++words;
    if (book.find(" " + word) != std::string::npos) ++known;
  }
  EXPECT_GE(words, 8) << result.output.substr(sample);
  EXPECT_GE(known * 2, words) << "fewer than half the sampled words are the book's:\n"
                              << result.output.substr(sample);
  // Nothing it started is left running.
  EXPECT_TRUE(ProcessesMentioning(work_dir).empty());
  fs::remove_all(work_dir);
  // The checkpoint lands where a user would look for it: under the current directory.
  EXPECT_TRUE(fs::exists(fs::current_path() / "checkpoints" / "shardline-up" / "latest"));
  fs::remove_all(fs::current_path() / "checkpoints" / "shardline-up");
}

TEST(UpTest, CtrlCStopsEverything) {
  const std::string work_dir = fs::temp_directory_path() / ("shardline-up-int-" + std::to_string(getpid()));
  SpawnOptions spawn;
  spawn.argv = {ShardlineBinary(), "up", "--devices", "2", "--work-dir", work_dir};
  spawn.log_path = work_dir + ".out";
  auto pid = Spawn(spawn);
  ASSERT_TRUE(pid.ok());
  // Wait until the job is underway: actors of this cluster exist. Its actors are told the
  // coordinator's endpoint, which the coordinator writes to WORK_DIR/endpoint; another `up` (the
  // test beside this one in a parallel ctest) runs actors of a job of the same name.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  std::string endpoint;
  const auto own_actors = [&] {
    if (endpoint.empty()) {
      std::ifstream file(work_dir + "/endpoint");
      std::getline(file, endpoint);
      if (endpoint.empty()) return std::vector<pid_t>{};
    }
    // Whole arguments (each ends in a NUL in /proc/PID/cmdline): port 3611 is not 36117.
    return ProcessesMentioning({endpoint + '\0', "shardline-up-1"});
  };
  while (std::chrono::steady_clock::now() < deadline && own_actors().empty()) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_FALSE(own_actors().empty()) << "no actor appeared";
  ASSERT_EQ(::kill(*pid, SIGINT), 0);
  auto exited = WaitFor(*pid, 30s);
  ASSERT_TRUE(exited.ok() && exited->has_value());
  EXPECT_EQ((*exited)->code, 130);
  std::ifstream out(spawn.log_path);
  std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("Interrupted"), std::string::npos) << text;
  EXPECT_TRUE(ProcessesMentioning(work_dir).empty());
  EXPECT_TRUE(own_actors().empty());
  fs::remove_all(work_dir);
  fs::remove(spawn.log_path);
}

TEST(UpTest, RunsAGivenJobSpec) {
  auto result = RunShardline(
      {"up", "--devices", "2", "--job", SourceDir() + "/examples/comm-check-small.yaml"}, 300s);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("succeeded"), std::string::npos) << result.output;
  auto too_many = RunShardline(
      {"up", "--devices", "2", "--job", SourceDir() + "/examples/comm-check.yaml"}, 60s);
  EXPECT_EQ(too_many.exit_code, 2);
  EXPECT_NE(too_many.output.find("wants 4 actors but --devices is 2"), std::string::npos)
      << too_many.output;
}

// examples/gpt-interleaved.yaml as a user runs it: the interleaved schedule and selective
// recomputation travel from the YAML through the coordinator to the actors, which train to the
// end, and the progress lines name both.
TEST(UpTest, RunsTheInterleavedExampleAndShowsItsScheduleAndRecomputation) {
  const fs::path dir =
      fs::temp_directory_path() / ("shardline-up-interleaved-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ifstream in(SourceDir() + "/examples/gpt-interleaved.yaml");
  std::string spec((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string relative = "dir: checkpoints/gpt-interleaved";
  const size_t at = spec.find(relative);
  ASSERT_NE(at, std::string::npos) << "the example's checkpoint dir moved";
  spec.replace(at, relative.size(), "dir: " + (dir / "checkpoints").string());
  std::ofstream(dir / "gpt-interleaved.yaml") << spec;

  auto result = RunShardline(
      {"up", "--devices", "2", "--job", (dir / "gpt-interleaved.yaml").string()}, 300s);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("succeeded"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("step 100/100"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("tp 1 x pp 2 x dp 1, zero 0, micro-batch 2 (4 per step), "
                               "interleaved x2, recompute selective"),
            std::string::npos)
      << result.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardline::testing
