// Checkpoints of `shardline train`'s loop (training::Train) as a user meets them: every kind of
// damage to a committed step is named (file, tensor) and `resume: latest` falls back past it; bad
// input is refused before any work, naming the setting and both values; a resumed run continues
// the uninterrupted one bit for bit; `keep` prunes; a crash at any point of a save leaves the last
// committed step loadable; and a save does not stop training while its file is written.
//
// Training runs in forked children (the parent never computes: OpenMP and OpenBLAS threads do not
// survive fork), which report back through small files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/resume.h"
#include "checkpoint/verify.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"
#include "placement/checkpoint_state.h"
#include "placement/train_spec.h"
#include "tests/support/file_damage.h"
#include "tests/support/forked_world.h"
#include "tests/support/test_file_systems.h"
#include "tests/support/tiny_train_spec.h"
#include "worker/training/model_checkpoint.h"
#include "worker/training/trainer.h"

namespace shardline::training {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `body` in a forked child and returns its exit code.
int InChild(const std::function<int()>& body) {
  const std::string store = testing::MakeTempDir("shardline_integrity_store");
  auto grid = placement::RankGrid::Create(1, 1, 1);
  const testing::ForkedWorldResult result = testing::RunForkedWorld(
      *grid, store,
      [&](int, const placement::RankCoords&, const model::ShardedGroups&) { return body(); },
      std::chrono::seconds(240));
  fs::remove_all(store);
  return result.exit_codes[0];
}

placement::TrainSpec Spec(const std::string& dir, int64_t steps, int64_t interval) {
  placement::TrainSpec spec = *placement::ParseTrainSpec(testing::kTinyTrainSpec, "tiny.yaml");
  spec.steps = steps;
  spec.log_interval = 1;
  spec.checkpoint.dir = dir;
  spec.checkpoint.interval = interval;
  return spec;
}

// What a child's Train reports back: its error, or where it started and its losses.
struct Outcome {
  std::string error;  // empty: it succeeded
  int64_t first_step = 0;
  std::string resumed_from;
  std::vector<int64_t> skipped;
  std::vector<float> losses;
};

// Trains `spec` in a child through `fs` (the real file system when null).
Outcome TrainInChild(const placement::TrainSpec& spec, checkpoint::FileSystem* fs = nullptr,
                     const TrainCallbacks& callbacks = {}) {
  const std::string report = testing::MakeTempDir("shardline_integrity_report") + "/outcome.json";
  const int code = InChild([&] {
    auto result = Train(spec, callbacks, nullptr, fs ? *fs : checkpoint::DefaultFileSystem());
    nlohmann::json out;
    if (!result.ok()) {
      out["error"] = std::string(result.status().message());
    } else {
      out["first_step"] = result->start.first_step;
      out["resumed_from"] = result->start.resumed_from;
      std::vector<int64_t> skipped;
      for (const auto& step : result->start.skipped) skipped.push_back(step.step);
      out["skipped"] = skipped;
      out["losses"] = result->losses;
    }
    std::ofstream(report) << out.dump();
    return 0;
  });
  Outcome outcome;
  if (code != 0) {
    outcome.error = "the child exited with " + std::to_string(code);
    return outcome;
  }
  const nlohmann::json in = nlohmann::json::parse(ReadText(report));
  fs::remove_all(fs::path(report).parent_path());
  if (in.contains("error")) {
    outcome.error = in["error"].get<std::string>();
    return outcome;
  }
  outcome.first_step = in["first_step"].get<int64_t>();
  outcome.resumed_from = in["resumed_from"].get<std::string>();
  outcome.skipped = in["skipped"].get<std::vector<int64_t>>();
  outcome.losses = in["losses"].get<std::vector<float>>();
  return outcome;
}

// A run's checkpoint dir with committed steps 2, 4 and 6, made once per process and copied for
// each test; removed when the process exits (the forked children leave with _exit, never here).
const std::string& BaseRun() {
  struct Base {
    std::string run;
    ~Base() { fs::remove_all(fs::path(run).parent_path()); }
  };
  static const Base base = [] {
    Base made{testing::MakeTempDir("shardline_integrity_base") + "/run"};
    const Outcome outcome = TrainInChild(Spec(made.run, 6, 2));
    EXPECT_TRUE(outcome.error.empty()) << outcome.error;
    return made;
  }();
  return base.run;
}

std::string CopyOfBase(const std::string& name) {
  const std::string dir = testing::MakeTempDir("shardline_integrity_" + name) + "/run";
  fs::copy(BaseRun(), dir, fs::copy_options::recursive);
  return dir;
}

std::string RankFile(const std::string& dir, int64_t step) {
  return (fs::path(checkpoint::StepDir(dir, step)) / checkpoint::ShardFileName(0)).string();
}

void EditManifest(const std::string& dir, int64_t step,
                  const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = checkpoint::ManifestPath(dir, step);
  nlohmann::json manifest = nlohmann::json::parse(ReadText(path));
  edit(manifest);
  std::ofstream(path) << manifest.dump(1);
}

struct Damage {
  std::string name;
  std::function<void(const std::string& dir)> apply;
  absl::StatusCode code;
  std::vector<std::string> named;  // what the error must say
};

std::vector<Damage> Damages() {
  return {
      {"missing shard", [](const std::string& dir) { fs::remove(RankFile(dir, 6)); },
       absl::StatusCode::kNotFound, {"checkpoint step 6", "rank-00000.safetensors", "is missing"}},
      {"truncated shard",
       [](const std::string& dir) {
         fs::resize_file(RankFile(dir, 6), fs::file_size(RankFile(dir, 6)) - 100);
       },
       absl::StatusCode::kDataLoss, {"rank-00000.safetensors", "truncated"}},
      {"flipped byte",
       [](const std::string& dir) {
         // Halfway into the file: inside the data of one tensor.
         testing::FlipBits(RankFile(dir, 6), static_cast<int64_t>(fs::file_size(RankFile(dir, 6)) / 2));
       },
       absl::StatusCode::kDataLoss,
       {"rank-00000.safetensors", "fails its checksum: the bytes of tensor '"}},
      {"header edited",
       [](const std::string& dir) {
         // The rank file's own metadata says which step it is: "6" becomes "7", valid JSON still.
         std::fstream file(RankFile(dir, 6), std::ios::in | std::ios::out | std::ios::binary);
         std::string head(4096, '\0');
         file.read(head.data(), static_cast<std::streamsize>(head.size()));
         const size_t at = head.find("\"step\":\"6\"");
         ASSERT_NE(at, std::string::npos);
         file.clear();
         file.seekp(static_cast<std::streamoff>(at + 8));
         file.write("7", 1);
       },
       absl::StatusCode::kDataLoss, {"rank-00000.safetensors", "its header changed"}},
      {"manifest without a tensor",
       [](const std::string& dir) {
         EditManifest(dir, 6, [](nlohmann::json& m) { m["tensors"].erase("h.1.fc.b"); });
       },
       absl::StatusCode::kNotFound, {"checkpoint step 6", "tensor 'h.1.fc.b' is missing"}},
      {"another model shape",
       [](const std::string& dir) {
         EditManifest(dir, 6, [](nlohmann::json& m) { m["metadata"]["d_ff"] = "64"; });
       },
       absl::StatusCode::kInvalidArgument,
       {"checkpoint step 6", "tensor 'h.0.fc.b' has global shape [128]", "expected [64]"}},
  };
}

TEST(CheckpointIntegrityTest, EveryKindOfDamageIsNamedAndResumeFallsBackPastIt) {
  for (const Damage& damage : Damages()) {
    SCOPED_TRACE(damage.name);
    const std::string dir = CopyOfBase("damage");
    damage.apply(dir);
    const absl::Status verified = checkpoint::VerifyStep(checkpoint::ManifestPath(dir, 6));
    EXPECT_EQ(verified.code(), damage.code) << verified;
    for (const std::string& named : damage.named) EXPECT_THAT(Message(verified), HasSubstr(named));
    // The steps before it still verify, and `resume: latest` takes the newest of them.
    EXPECT_TRUE(checkpoint::VerifyStep(checkpoint::ManifestPath(dir, 4)).ok());
    absl::StatusOr<checkpoint::ResumeDecision> decision =
        checkpoint::DecideResume({dir, checkpoint::ResumeMode::kLatest});
    ASSERT_TRUE(decision.ok()) << decision.status();
    EXPECT_EQ(decision->step, 4);
    ASSERT_EQ(decision->skipped.size(), 1u);
    EXPECT_EQ(decision->skipped[0].step, 6);
    EXPECT_EQ(decision->skipped[0].reason, Message(verified));
    fs::remove_all(fs::path(dir).parent_path());
  }
}

TEST(CheckpointIntegrityTest, TrainingResumesFromTheLastStepThatVerifiesAndSetsTheDamagedOneAside) {
  const std::string dir = CopyOfBase("fallback");
  testing::FlipBits(RankFile(dir, 6), static_cast<int64_t>(fs::file_size(RankFile(dir, 6)) / 2));
  fs::create_directories(checkpoint::StepDir(dir, 8));  // an interrupted save of a later step
  const Outcome outcome = TrainInChild(Spec(dir, 8, 2));
  ASSERT_TRUE(outcome.error.empty()) << outcome.error;
  EXPECT_EQ(outcome.first_step, 5);
  EXPECT_EQ(outcome.resumed_from, checkpoint::ManifestPath(dir, 4));
  EXPECT_THAT(outcome.skipped, ElementsAre(6));
  EXPECT_EQ(outcome.losses.size(), 4u);
  // The damaged step is kept aside for inspection; the run wrote steps 6 and 8 afresh.
  EXPECT_TRUE(fs::exists(checkpoint::StepDir(dir, 6) + ".corrupt"));
  EXPECT_THAT(*checkpoint::CommittedSteps(dir), ElementsAre(2, 4, 6, 8));
  for (const int64_t step : {6, 8}) {
    EXPECT_TRUE(checkpoint::VerifyStep(checkpoint::ManifestPath(dir, step)).ok()) << step;
  }
  EXPECT_EQ(*checkpoint::ReadLatest(dir), 8);
  // With every committed step damaged there is nothing to fall back to: an error, not a fresh
  // start over the run.
  for (const int64_t step : {2, 4, 6, 8}) fs::remove(RankFile(dir, step));
  const Outcome none = TrainInChild(Spec(dir, 10, 2));
  EXPECT_THAT(none.error, AllOf(HasSubstr("no committed step of " + dir + " verifies"),
                                HasSubstr("step 8"), HasSubstr("step 2")));
  fs::remove_all(fs::path(dir).parent_path());
}

TEST(CheckpointIntegrityTest, BadInputIsRefusedBeforeAnyWorkNamingTheSettingAndBothValues) {
  const std::string dir = CopyOfBase("bad-input");
  const std::string before = ReadText(checkpoint::ManifestPath(dir, 6));
  struct Case {
    std::string name;
    std::function<void(placement::TrainSpec&)> change;
    std::vector<std::string> named;
  };
  const std::string text = dir + "/../not-a-checkpoint.txt";
  std::ofstream(text) << "hello";
  const std::vector<Case> cases = {
      {"layers", [](placement::TrainSpec& s) { s.model.layers = 3; },
       {"model.layers is 2 in the checkpoint but 3 in the spec"}},
      {"d_model", [](placement::TrainSpec& s) { s.model.d_model = 64; },
       {"model.d_model is 32 in the checkpoint but 64 in the spec"}},
      {"vocab", [](placement::TrainSpec& s) { s.model.vocab = 300; },
       {"model.vocab is 257 in the checkpoint but 300 in the spec"}},
      {"seed", [](placement::TrainSpec& s) { s.seed = 4; },
       {"seed is 3 in the checkpoint but 4 in the spec"}},
      {"batch", [](placement::TrainSpec& s) { s.batch = 8; },
       {"batch is 4 in the checkpoint but 8 in the spec"}},
      {"data", [](placement::TrainSpec& s) { s.data.synthetic_seed = 8; },
       {"data is the synthetic corpus (seed 7, 262144 bytes) in the checkpoint but the synthetic "
        "corpus (seed 8, 262144 bytes) in the spec"}},
      {"resume none",
       [](placement::TrainSpec& s) { s.checkpoint.resume = checkpoint::ResumeMode::kNone; },
       {"already holds committed steps (the newest is 6)", "resume: none"}},
      {"resume an older step",
       [&](placement::TrainSpec& s) {
         s.checkpoint.resume = checkpoint::ResumeMode::kPath;
         s.checkpoint.resume_path = checkpoint::StepDir(dir, 2);
       },
       {"resume: step 2 is older than the newest committed step 6"}},
      {"init_from what is not a checkpoint",
       [&](placement::TrainSpec& s) {
         s.checkpoint.dir = dir + "/../fresh";
         s.init_from = text;
       },
       {"init_from " + text, "not a checkpoint"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    placement::TrainSpec spec = Spec(dir, 10, 2);
    c.change(spec);
    const Outcome outcome = TrainInChild(spec);
    ASSERT_FALSE(outcome.error.empty());
    for (const std::string& named : c.named) EXPECT_THAT(outcome.error, HasSubstr(named));
    // Nothing was written: the same committed steps, the same newest manifest.
    EXPECT_THAT(*checkpoint::CommittedSteps(dir), ElementsAre(2, 4, 6));
    EXPECT_EQ(ReadText(checkpoint::ManifestPath(dir, 6)), before);
    EXPECT_EQ(*checkpoint::ReadLatest(dir), 6);
  }
  EXPECT_FALSE(fs::exists(dir + "/../fresh/step-00000002"));
  fs::remove_all(fs::path(dir).parent_path());
}

// Every parameter and both moments of a committed step, by tensor name.
std::map<std::string, std::vector<float>> StateOf(const std::string& dir) {
  std::map<std::string, std::vector<float>> state;
  absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(dir);
  EXPECT_TRUE(source.ok()) << source.status();
  if (!source.ok()) return state;
  for (const auto& [name, tensor] : source->manifest()->tensors) {
    const std::vector<int64_t> zeros(tensor.global_shape.size(), 0);
    absl::StatusOr<std::vector<float>> values =
        ReadCheckpointBox(*source, name, zeros, tensor.global_shape);
    EXPECT_TRUE(values.ok()) << values.status();
    state[name] = *values;
  }
  return state;
}

TEST(CheckpointIntegrityTest, AResumedRunContinuesTheUninterruptedOneBitForBit) {
  const std::string root = testing::MakeTempDir("shardline_integrity_bits");
  const Outcome straight = TrainInChild(Spec(root + "/straight", 8, 4));
  ASSERT_TRUE(straight.error.empty()) << straight.error;
  ASSERT_TRUE(TrainInChild(Spec(root + "/split", 4, 4)).error.empty());
  const Outcome resumed = TrainInChild(Spec(root + "/split", 8, 4));
  ASSERT_TRUE(resumed.error.empty()) << resumed.error;
  EXPECT_EQ(resumed.first_step, 5);
  ASSERT_EQ(resumed.losses.size(), 4u);
  ASSERT_EQ(straight.losses.size(), 8u);
  EXPECT_EQ(0, std::memcmp(resumed.losses.data(), straight.losses.data() + 4, 4 * sizeof(float)))
      << "the losses of steps 5..8 differ";
  const auto a = StateOf(root + "/straight");
  const auto b = StateOf(root + "/split");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(a.contains("optim.exp_avg_sq.h.1.qkv.w"));
  for (const auto& [name, values] : a) {
    ASSERT_TRUE(b.contains(name)) << name;
    EXPECT_EQ(0, std::memcmp(values.data(), b.at(name).data(), values.size() * sizeof(float)))
        << name << " differs after resuming";
  }
  fs::remove_all(root);
}

TEST(CheckpointIntegrityTest, KeepRemovesTheOldestCommittedSteps) {
  const std::string root = testing::MakeTempDir("shardline_integrity_keep");
  placement::TrainSpec spec = Spec(root + "/run", 10, 2);
  spec.checkpoint.keep = 2;
  ASSERT_TRUE(TrainInChild(spec).error.empty());
  EXPECT_THAT(*checkpoint::CommittedSteps(root + "/run"), ElementsAre(8, 10));
  EXPECT_EQ(*checkpoint::ReadLatest(root + "/run"), 10);
  fs::remove_all(root);
}

// A save is: the rank file (open, appends, commit), the manifest, `latest`, retention. The child
// resumes after step 4 and saves step 6 through a file system that ends it just before its N-th
// operation, for every N: whatever a reader finds afterwards is a committed step that verifies —
// step 6 once its manifest is in place, step 4 before — and a run resumed from there finishes.
TEST(CheckpointIntegrityTest, ACrashAtAnyPointOfASaveLeavesTheLastCommittedStepLoadable) {
  const std::string root = testing::MakeTempDir("shardline_integrity_crash");
  ASSERT_TRUE(TrainInChild(Spec(root + "/base", 4, 4)).error.empty());
  int crashes = 0;
  for (int crash_at = 1;; ++crash_at) {
    const std::string dir = root + "/at-" + std::to_string(crash_at);
    fs::copy(root + "/base", dir, fs::copy_options::recursive);
    testing::CrashingFileSystem crashing(crash_at);
    const int code = InChild([&] {
      auto result = Train(Spec(dir, 6, 2), {}, nullptr, crashing);
      return result.ok() ? 0 : 1;
    });
    ASSERT_TRUE(code == 0 || code == testing::CrashingFileSystem::kCrashExit) << code;
    absl::StatusOr<checkpoint::ResumeDecision> decision =
        checkpoint::DecideResume({dir, checkpoint::ResumeMode::kLatest});
    ASSERT_TRUE(decision.ok()) << "crash at operation " << crash_at << ": " << decision.status();
    EXPECT_TRUE(decision->skipped.empty()) << "crash at operation " << crash_at;
    EXPECT_TRUE(decision->step == 4 || decision->step == 6) << decision->step;
    EXPECT_TRUE(CheckpointSource::Open(dir).ok()) << "crash at operation " << crash_at;
    fs::remove_all(dir);
    if (code == 0) break;  // past the last operation: the save completed
    ++crashes;
  }
  // Every operation of the save was a crash point: the step folder, the rank file's open, its
  // appends (the header, each of the 3 × P tensors of P parameters) and commit, then the
  // manifest's and latest's open, append and commit.
  const model::ModelConfig config = Spec("", 1, 0).model;
  const int parameters = static_cast<int>(model::ModelRows(config).size());
  EXPECT_EQ(crashes, 1 + 1 + 1 + 3 * parameters + 1 + 3 + 3);
  // And a run resumed after a crash in the middle of the rank file finishes the job.
  const std::string dir = root + "/resume";
  fs::copy(root + "/base", dir, fs::copy_options::recursive);
  testing::CrashingFileSystem crashing(4);
  ASSERT_EQ(InChild([&] { return Train(Spec(dir, 6, 2), {}, nullptr, crashing).ok() ? 0 : 1; }),
            testing::CrashingFileSystem::kCrashExit);
  const Outcome finished = TrainInChild(Spec(dir, 6, 2));
  ASSERT_TRUE(finished.error.empty()) << finished.error;
  EXPECT_EQ(finished.first_step, 5);
  EXPECT_THAT(*checkpoint::CommittedSteps(dir), ElementsAre(4, 6));
  fs::remove_all(root);
}

// The file of the save after step 2 is held at a gate: training goes on to step 3 meanwhile (it
// does not wait for the writer), and step 4's save waits until that file is committed (a new save
// waits for the previous one). No timing decides the verdict: had training waited for the writer,
// step 3 would never have come while the file was held, and the child would have run out of its
// deadline.
TEST(CheckpointIntegrityTest, ASaveDoesNotStopTrainingAndTheNextSaveWaitsForIt) {
  const std::string root = testing::MakeTempDir("shardline_integrity_async");
  const std::string report = root + "/events.txt";
  const int code = InChild([&] {
    testing::GatedFileSystem gated;
    std::mutex mu;
    std::vector<std::string> events;
    const auto note = [&](const std::string& event) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(event);
    };
    std::thread opener;
    TrainCallbacks callbacks;
    callbacks.on_progress = [&](const TrainProgress& p) {
      if (p.step != 3) {
        note("step " + std::to_string(p.step));
        return;
      }
      // Step 2's file is being written by now, or soon: wait (bounded) until it is at the gate.
      const auto until = std::chrono::steady_clock::now() + 30s;
      while (!gated.Holding() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
      }
      note(gated.Holding() ? "step 3 while step 2's file is held" : "step 3, nothing held");
      // Open the gate from another thread a little later, so that the loop meets step 4's save
      // while step 2's is still held.
      opener = std::thread([&] {
        std::this_thread::sleep_for(300ms);
        note("open");
        gated.Open();
      });
    };
    callbacks.on_committed = [&](int64_t step, const std::string&) {
      note("committed " + std::to_string(step));
    };
    auto result = Train(Spec(root + "/run", 4, 2), callbacks, nullptr, gated);
    if (opener.joinable()) opener.join();
    std::ofstream out(report);
    for (const std::string& event : events) out << event << "\n";
    if (!result.ok()) out << "error " << result.status().message() << "\n";
    return result.ok() ? 0 : 1;
  });
  ASSERT_EQ(code, 0) << ReadText(report);
  std::vector<std::string> events;
  std::istringstream lines(ReadText(report));
  for (std::string line; std::getline(lines, line);) events.push_back(line);
  const auto at = [&](const std::string& event) {
    return std::find(events.begin(), events.end(), event) - events.begin();
  };
  const auto missing = static_cast<std::ptrdiff_t>(events.size());
  ASSERT_NE(at("step 3 while step 2's file is held"), missing) << ReadText(report);
  // Step 4 came only once step 2's file was committed, which the gate held until "open".
  EXPECT_LT(at("step 3 while step 2's file is held"), at("open")) << ReadText(report);
  EXPECT_LT(at("open"), at("committed 2")) << ReadText(report);
  EXPECT_LT(at("committed 2"), at("step 4")) << ReadText(report);
  EXPECT_NE(at("committed 4"), missing) << ReadText(report);
  EXPECT_THAT(*checkpoint::CommittedSteps(root + "/run"), ElementsAre(2, 4));
  fs::remove_all(root);
}

}  // namespace
}  // namespace shardline::training
