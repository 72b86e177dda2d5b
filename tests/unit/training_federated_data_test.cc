// Federated data (data.per_site): each DiLoCo site reads only its own file. Checked by taking the
// others away: each rank runs in a mount namespace of its own where the other site's folder is an
// empty tmpfs, so that reading it would fail. Real processes (forked ranks over shared memory).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "placement/job_spec.h"
#include "tests/support/forked_world.h"
#include "worker/training/sharded_trainer.h"

namespace shardline::training {
namespace {

namespace fs = std::filesystem;

constexpr int kHiddenUnavailable = 77;  // a rank could not make its mount namespace

// Makes `dir` an empty, private tmpfs for this process and its children only.
bool HideFolder(const std::string& dir) {
  if (unshare(CLONE_NEWNS) != 0) return false;
  // Private first, so that the tmpfs never shows in the machine's own mount table.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  return mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") == 0;
}

struct SiteRun {
  std::vector<int> exit_codes;
  std::vector<std::string> errors;         // per rank, empty when it trained
  std::vector<std::vector<float>> losses;  // per rank
};

// Trains `steps` DiLoCo steps at dp 2 with data.per_site = `files`; rank r hides `hidden[r]`.
SiteRun Train(const std::string& root, const std::vector<std::string>& files,
              const std::vector<std::string>& hidden, int steps) {
  const std::string yaml =
      "name: federated\nkind: train\ndevices: cpu\n"
      "parallel: {dp: 2}\n"
      "data_parallel: {sync: diloco, every: 50}\n"
      "model: {layers: 2, heads: 2, d_model: 32, max_seq_len: 16}\n"
      "data: {per_site: [" +
      files[0] + ", " + files[1] +
      "]}\n"
      "optimizer: {lr: 1.0e-2}\n"
      "steps: " +
      std::to_string(steps) + "\nbatch: 8\nseq_len: 16\nlog_interval: 1\n";
  absl::StatusOr<placement::JobSpec> job = placement::ParseJobSpec(yaml, "federated.yaml");
  EXPECT_TRUE(job.ok()) << job.status();
  const std::string store = root + "/store";
  fs::remove_all(store);
  fs::create_directories(store);
  auto grid = placement::RankGrid::Create(1, 1, 2);
  const testing::ForkedWorldResult result = testing::RunForkedWorld(
      *grid, store,
      [&](int rank, const placement::RankCoords&, const model::ShardedGroups& groups) {
        if (!HideFolder(hidden[rank])) {
          std::ofstream(root + "/error-" + std::to_string(rank)) << std::strerror(errno);
          return kHiddenUnavailable;
        }
        ShardedTrainOptions options;
        options.spec = *job;
        options.rank = rank;
        options.groups = groups;
        auto trained = TrainSharded(options);
        if (!trained.ok()) {
          std::ofstream(root + "/error-" + std::to_string(rank)) << trained.status().message();
          return 1;
        }
        std::ofstream out(root + "/losses-" + std::to_string(rank));
        for (float loss : trained->losses) out << loss << "\n";
        return 0;
      });
  SiteRun run;
  run.exit_codes = result.exit_codes;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream error(root + "/error-" + std::to_string(rank));
    run.errors.emplace_back(std::istreambuf_iterator<char>(error),
                            std::istreambuf_iterator<char>());
    std::ifstream in(root + "/losses-" + std::to_string(rank));
    std::vector<float> losses;
    for (float loss; in >> loss;) losses.push_back(loss);
    run.losses.push_back(std::move(losses));
    fs::remove(root + "/error-" + std::to_string(rank));
    fs::remove(root + "/losses-" + std::to_string(rank));
  }
  return run;
}

class FederatedDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("shardline_federated");
    // Two very different corpora: site 0's one repeated phrase is learnt fast, site 1's letters
    // drawn at random are not.
    for (const char* site : {"site0", "site1"}) fs::create_directories(root_ + "/" + site);
    std::string easy, hard;
    for (int i = 0; i < 400; ++i) easy += "the same words again. ";
    uint64_t x = 12345;
    for (int i = 0; i < 8000; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      hard += static_cast<char>('a' + (x >> 33) % 26);
    }
    std::ofstream(root_ + "/site0/data.txt") << easy;
    std::ofstream(root_ + "/site1/data.txt") << hard;
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(FederatedDataTest, EachSiteTrainsOnItsOwnFileWithoutSeeingTheOthers) {
  const SiteRun run = Train(root_, {root_ + "/site0/data.txt", root_ + "/site1/data.txt"},
                            {root_ + "/site1", root_ + "/site0"}, 30);
  if (run.exit_codes[0] == kHiddenUnavailable || run.exit_codes[1] == kHiddenUnavailable) {
    GTEST_SKIP() << "cannot make a mount namespace (needs root): " << run.errors[0]
                 << run.errors[1];
  }
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << run.errors[0] << " | " << run.errors[1];
  ASSERT_EQ(run.losses[0].size(), 30u);
  ASSERT_EQ(run.losses[1].size(), 30u);
  // Each site's loss is its own data's (no outer step within 30 steps of rounds of 50): the
  // repeated phrase is far easier than random letters, whose entropy is ln 26 = 3.26.
  EXPECT_LT(run.losses[0].back() + 0.5, run.losses[1].back())
      << "site 0 " << run.losses[0].back() << ", site 1 " << run.losses[1].back();
}

// The control: a site that is given the other's file cannot read it, so the check above is real.
TEST_F(FederatedDataTest, ASiteCannotReadAnotherSitesHiddenFile) {
  const SiteRun run = Train(root_, {root_ + "/site0/data.txt", root_ + "/site0/data.txt"},
                            {root_ + "/site1", root_ + "/site0"}, 2);
  if (run.exit_codes[0] == kHiddenUnavailable || run.exit_codes[1] == kHiddenUnavailable) {
    GTEST_SKIP() << "cannot make a mount namespace (needs root)";
  }
  EXPECT_NE(run.exit_codes[1], 0);
  EXPECT_NE(run.errors[1].find(root_ + "/site0/data.txt"), std::string::npos) << run.errors[1];
}

}  // namespace
}  // namespace shardline::training
