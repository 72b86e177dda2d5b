// The coordinator's side of `kind: train` jobs, over the real wire against the real coordinator
// process: a bad layout refused before anything is spawned, the groups of every parallel
// dimension in the Assignment and in the bootstrap deadline's error, StepReports aggregated into
// the job's progress and metrics, and sharded checkpoints committed (manifest.json, then latest)
// only once every rank has saved its shard.
//
// The actors here are fakes, built from the real RpcClient, that speak the actor's protocol by
// hand (as does the node they run on): the coordinator's commit logic is tested before the real
// sharded actor exists, and each message can be sent exactly when and as wrongly as a test needs.
// The end-to-end train job with real actors lives in its own test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>

#include "checkpoint/manifest.h"
#include "placement/parallel_layout.h"
#include "protocol/rpc_client.h"
#include "tests/integration/local_cluster.h"

namespace shardline::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;
using protocol::Str;

constexpr auto kCallTimeout = 10s;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string WriteTemp(const std::string& dir, const std::string& name, const std::string& text) {
  fs::create_directories(dir);
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// A small GPT (4 heads) on tp 2 x pp 2 x dp 1: ranks 0, 1 are stage 0 (tp 0, 1), ranks 2, 3
// stage 1.
std::string TrainYaml(const std::string& name, const std::string& checkpoint_dir,
                      const std::string& parallel = "  tp: 2\n  pp: 2\n  dp: 1\n  zero: 1\n",
                      const std::string& extra = "") {
  return "name: " + name + "\nkind: train\ndevices: cpu\n" + extra +
         "model:\n  layers: 2\n  heads: 4\n  d_model: 8\n  d_ff: 32\n  vocab: 260\n"
         "  max_seq_len: 8\n"
         "steps: 20\nbatch: 4\nseq_len: 8\nlog_interval: 10\n"
         "checkpoint:\n  dir: " +
         checkpoint_dir +
         "\n  interval: 10\n"
         "parallel:\n" +
         parallel;
}

// Sends `message` and returns the reply, an error reply as its Status.
absl::StatusOr<std::unique_ptr<protocol::Message>> Call(protocol::RpcClient& client,
                                                        protocol::Outgoing& message) {
  return client.Call(message, kCallTimeout);
}

// A node agent's side of the wire, by hand: it registers devices and reports the SpawnActors it
// gets, spawning nothing.
class FakeNode {
 public:
  static absl::StatusOr<std::unique_ptr<FakeNode>> Register(const LocalCluster& cluster,
                                                            const std::string& node_id,
                                                            int devices) {
    auto node = std::unique_ptr<FakeNode>(new FakeNode);
    node->node_id_ = node_id;
    auto client = protocol::RpcClient::Connect(cluster.endpoint(), "shardline", "agent/" + node_id,
                                               cluster.node_curve());
    if (!client.ok()) return client.status();
    node->client_ = std::move(*client);
    if (auto status = node->SendRegistration(devices); !status.ok()) return status;
    return node;
  }

  // RegisterNode again from the same agent (same instance), now with `devices` devices.
  absl::Status SendRegistration(int devices) {
    auto message = client_->NewMessage();
    auto request = message->payload().initRegisterNode();
    request.setNodeId(node_id_);
    request.setInstanceId("fake-instance");
    request.setHostname("fake-host");
    request.setAddress("127.0.0.1");
    auto list = request.initDevices(static_cast<unsigned>(devices));
    for (int d = 0; d < devices; ++d) {
      list[d].setKind(wire::DeviceKind::CPU);
      list[d].setIndex(static_cast<uint32_t>(d));
      list[d].setName("fake cpu");
    }
    return Call(*client_, *message).status();
  }

  // The generation and ranks of the next SpawnActors for `job_id`.
  absl::StatusOr<std::pair<uint32_t, std::vector<uint32_t>>> WaitForSpawn(
      const std::string& job_id, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto message = client_->NextMessage(100ms);
      if (!message.ok()) return message.status();
      if (!*message || (*message)->which() != wire::Envelope::Payload::SPAWN_ACTORS) continue;
      auto spawn = (*message)->envelope().getPayload().getSpawnActors();
      if (Str(spawn.getJobId()) != job_id) continue;
      std::vector<uint32_t> ranks;
      for (auto actor : spawn.getActors()) {
        ranks.push_back(actor.getRank());
        tokens_[{spawn.getGeneration(), actor.getRank()}] = Str(actor.getToken());
      }
      return std::make_pair(spawn.getGeneration(), ranks);
    }
    return absl::DeadlineExceededError("no SpawnActors for job " + job_id);
  }

  const std::string& node_id() const { return node_id_; }
  // The actor token a SpawnActors gave for (generation, rank), as an agent hands it on.
  std::string token(uint32_t generation, uint32_t rank) const {
    auto it = tokens_.find({generation, rank});
    return it == tokens_.end() ? std::string() : it->second;
  }

 private:
  FakeNode() = default;
  std::string node_id_;
  std::map<std::pair<uint32_t, uint32_t>, std::string> tokens_;
  std::unique_ptr<protocol::RpcClient> client_;
};

struct GroupInfo {
  std::string kind;
  std::string id;
  std::vector<uint32_t> ranks;
};

// One rank's side of the wire, by hand (see the file comment).
class FakeActor {
 public:
  static absl::StatusOr<std::unique_ptr<FakeActor>> Register(const LocalCluster& cluster,
                                                             const std::string& job_id,
                                                             uint32_t generation, uint32_t rank,
                                                             const std::string& node_id,
                                                             const std::string& token) {
    auto actor = std::unique_ptr<FakeActor>(new FakeActor);
    actor->job_id_ = job_id;
    actor->generation_ = generation;
    actor->rank_ = rank;
    auto client = protocol::RpcClient::Connect(
        cluster.endpoint(), "shardline",
        "actor/" + job_id + "/" + std::to_string(generation) + "/" + std::to_string(rank),
        cluster.node_curve());
    if (!client.ok()) return client.status();
    actor->client_ = std::move(*client);
    actor->client_->set_actor_token(token);
    auto message = actor->client_->NewMessage();
    auto request = message->payload().initRegisterActor();
    request.setJobId(job_id);
    request.setGeneration(generation);
    request.setRank(rank);
    request.setNodeId(node_id);
    request.setPid(static_cast<uint32_t>(::getpid()));
    request.setAddress("127.0.0.1");
    auto reply = Call(*actor->client_, *message);
    if (!reply.ok()) return reply.status();
    if ((*reply)->which() != wire::Envelope::Payload::ASSIGNMENT) {
      return absl::InternalError("expected an assignment");
    }
    auto assignment = (*reply)->envelope().getPayload().getAssignment();
    actor->kind_ = Str(assignment.getKind());
    actor->spec_dir_ = Str(assignment.getSpecDir());
    actor->work_dir_ = Str(assignment.getWorkDir());
    actor->world_size_ = assignment.getWorldSize();
    for (auto group : assignment.getGroups()) {
      GroupInfo info{Str(group.getKind()), Str(group.getId()), {}};
      for (auto r : group.getRanks()) info.ranks.push_back(r);
      actor->groups_.push_back(std::move(info));
    }
    return actor;
  }

  // CommJoin and CommReady for every group this rank is in, as the real actor's Bootstrap does.
  absl::Status JoinAllGroups() {
    for (const auto& group : groups_) {
      if (std::find(group.ranks.begin(), group.ranks.end(), rank_) == group.ranks.end()) continue;
      auto join = client_->NewMessage();
      auto j = join->payload().initCommJoin();
      j.setJobId(job_id_);
      j.setGeneration(generation_);
      j.setRank(rank_);
      j.setGroupId(group.id);
      if (auto reply = Call(*client_, *join); !reply.ok()) return reply.status();
      auto ready = client_->NewMessage();
      auto r = ready->payload().initCommReady();
      r.setJobId(job_id_);
      r.setGeneration(generation_);
      r.setRank(rank_);
      r.setGroupId(group.id);
      r.setSeconds(0.01);
      if (auto reply = Call(*client_, *ready); !reply.ok()) return reply.status();
    }
    return absl::OkStatus();
  }

  // `network`: bytes per step by group kind, world, tp, pp, dp; none: not measured.
  absl::Status Report(uint64_t step, double loss, double tokens_per_second, double compute,
                      double comm, double bubble,
                      std::optional<std::array<double, 4>> network = std::nullopt) {
    auto message = client_->NewMessage();
    auto report = message->payload().initStepReport();
    report.setJobId(job_id_);
    report.setGeneration(generation_);
    report.setRank(rank_);
    report.setStep(step);
    report.setLoss(loss);
    report.setTokensPerSecond(tokens_per_second);
    report.setComputeSeconds(compute);
    report.setCommSeconds(comm);
    report.setBubbleSeconds(bubble);
    if (network) {
      auto bytes = report.initNetworkBytesPerStep();
      bytes.setWorld((*network)[0]);
      bytes.setTp((*network)[1]);
      bytes.setPp((*network)[2]);
      bytes.setDp((*network)[3]);
    }
    return Call(*client_, *message).status();
  }

  struct Tensor {
    std::string name;
    std::vector<uint64_t> global_shape, offsets, shape;
    std::string dtype = "F32";
  };

  // A ShardSaved, of a file it writes first (the coordinator commits only files that are on disk
  // with the size reported; their content is the loaders' to check); the job id, generation and
  // rank may be overridden to send a bad one.
  absl::Status SaveShard(uint64_t step, const std::string& dir, const std::string& file,
                         const std::vector<Tensor>& tensors, std::string job_id = "",
                         int64_t generation = -1, int64_t rank = -1) {
    const std::string contents = "shard of rank " + std::to_string(rank_);
    if (fs::is_directory(dir) && fs::path(file).is_relative() &&
        file.find("..") == std::string::npos) {
      std::ofstream(fs::path(dir) / file) << contents;
    }
    auto message = client_->NewMessage();
    auto saved = message->payload().initShardSaved();
    saved.setJobId(job_id.empty() ? job_id_ : job_id);
    saved.setGeneration(generation < 0 ? generation_ : static_cast<uint32_t>(generation));
    saved.setRank(rank < 0 ? rank_ : static_cast<uint32_t>(rank));
    saved.setStep(step);
    saved.setDir(dir);
    saved.setFile(file);
    saved.setFileBytes(contents.size());
    saved.setFileXxh3(0x1234);
    auto list = saved.initTensors(static_cast<unsigned>(tensors.size()));
    for (size_t i = 0; i < tensors.size(); ++i) {
      list[i].setName(tensors[i].name);
      list[i].setDtype(tensors[i].dtype);
      const auto fill = [](auto out, const std::vector<uint64_t>& in) {
        for (size_t k = 0; k < in.size(); ++k) out.set(static_cast<unsigned>(k), in[k]);
      };
      fill(list[i].initGlobalShape(static_cast<unsigned>(tensors[i].global_shape.size())),
           tensors[i].global_shape);
      fill(list[i].initOffsets(static_cast<unsigned>(tensors[i].offsets.size())),
           tensors[i].offsets);
      fill(list[i].initShape(static_cast<unsigned>(tensors[i].shape.size())), tensors[i].shape);
    }
    return Call(*client_, *message).status();
  }

  absl::Status Done(bool ok, const std::string& text) {
    auto message = client_->NewMessage();
    auto done = message->payload().initActorDone();
    done.setJobId(job_id_);
    done.setGeneration(generation_);
    done.setRank(rank_);
    done.setOk(ok);
    done.setMessage(text);
    return Call(*client_, *message).status();
  }

  uint32_t rank() const { return rank_; }
  const std::string& kind() const { return kind_; }
  const std::string& spec_dir() const { return spec_dir_; }
  const std::string& work_dir() const { return work_dir_; }
  uint32_t world_size() const { return world_size_; }
  const std::vector<GroupInfo>& groups() const { return groups_; }

 private:
  FakeActor() = default;
  std::string job_id_;
  uint32_t generation_ = 0;
  uint32_t rank_ = 0;
  std::unique_ptr<protocol::RpcClient> client_;
  std::string kind_, spec_dir_, work_dir_;
  uint32_t world_size_ = 0;
  std::vector<GroupInfo> groups_;
};

// Submits `yaml` as a client in `work_dir` with its spec in `spec_dir` would.
absl::StatusOr<std::string> SubmitFrom(const LocalCluster& cluster, const std::string& yaml,
                                       const std::string& spec_dir, const std::string& work_dir) {
  auto client =
      protocol::RpcClient::Connect(cluster.endpoint(), "shardline", "test", cluster.client_curve());
  if (!client.ok()) return client.status();
  auto message = (*client)->NewMessage();
  auto submit = message->payload().initSubmitJob();
  submit.setSpecYaml(yaml);
  submit.setSourceName("train.yaml");
  submit.setSpecDir(spec_dir);
  submit.setWorkDir(work_dir);
  auto reply = Call(**client, *message);
  if (!reply.ok()) return reply.status();
  return Str((*reply)->envelope().getPayload().getSubmitJobReply().getJobId());
}

// A coordinator whose fake node never misses a heartbeat that matters: the fake sends none.
LocalCluster::Options PatientCluster() {
  LocalCluster::Options options;
  options.heartbeat_interval = 1s;
  options.heartbeat_timeout = 120s;
  return options;
}

// Registers every rank of the spawned generation and bootstraps all its groups.
std::vector<std::unique_ptr<FakeActor>> StartActors(LocalCluster& cluster, FakeNode& node,
                                                    const std::string& job_id, int world) {
  std::vector<std::unique_ptr<FakeActor>> actors;
  auto spawn = node.WaitForSpawn(job_id, 20s);
  EXPECT_TRUE(spawn.ok()) << spawn.status();
  if (!spawn.ok()) return actors;
  EXPECT_EQ(spawn->second.size(), static_cast<size_t>(world));
  for (uint32_t rank : spawn->second) {
    auto actor = FakeActor::Register(cluster, job_id, spawn->first, rank, node.node_id(),
                                     node.token(spawn->first, rank));
    EXPECT_TRUE(actor.ok()) << actor.status();
    if (!actor.ok()) return {};
    actors.push_back(std::move(*actor));
  }
  std::sort(actors.begin(), actors.end(),
            [](const auto& a, const auto& b) { return a->rank() < b->rank(); });
  for (auto& actor : actors) {
    const absl::Status joined = actor->JoinAllGroups();
    EXPECT_TRUE(joined.ok()) << joined;
  }
  return actors;
}

using Tensor = FakeActor::Tensor;

// The shard of `rank` (tp 2 x pp 2 x dp 1): stage 0 holds wte split by vocabulary rows and a
// replicated LayerNorm, stage 1 an MLP weight split by rows and the replicated final LayerNorm.
std::vector<Tensor> ShardOf(uint32_t rank) {
  const uint64_t tp = rank % 2;
  if (rank < 2) {
    return {{"wte", {260, 8}, {130 * tp, 0}, {130, 8}}, {"h.0.ln1.w", {8}, {0}, {8}}};
  }
  return {{"h.1.fc.w", {32, 8}, {16 * tp, 0}, {16, 8}}, {"lnf.w", {8}, {0}, {8}}};
}

std::string StepDir(const std::string& checkpoint_dir, int step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08d", step);
  return checkpoint_dir + "/" + name;
}

TEST(ClusterTrainTest, BadLayoutIsRefusedBySubmitAndNothingIsSpawned) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("node-a", "cpu:4").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  const std::string ckpt = cluster.dir() + "/ckpt";

  struct Case {
    std::string name;
    std::string parallel;
    std::string extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"too-many", "  tp: 2\n  pp: 2\n  dp: 2\n", "actors: 4\n",
       "tp·pp·dp = 2·2·2 = 8 but the job has 4 actors: 4 too many"},
      {"heads", "  tp: 3\n  pp: 1\n  dp: 1\n", "", "heads 4 is not divisible by tp 3: remainder 1"},
      {"tp-past-heads", "  tp: 8\n  pp: 1\n  dp: 1\n", "", "tp 8 is more than heads 4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string spec = WriteTemp(cluster.dir() + "/specs", c.name + ".yaml",
                                       TrainYaml("bad-" + c.name, ckpt, c.parallel, c.extra));
    auto result = RunShardline(
        {"submit", spec, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()});
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(c.message), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(c.name + ".yaml:"), std::string::npos)
        << "the error names the file: " << result.output;
    EXPECT_NE(result.output.find("parallel"), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("submitted job"), std::string::npos) << result.output;

    // A client that skips the check gets the same from the coordinator.
    auto direct = SubmitFrom(cluster, TrainYaml("bad-" + c.name, ckpt, c.parallel, c.extra),
                             cluster.dir(), cluster.dir());
    ASSERT_FALSE(direct.ok());
    EXPECT_EQ(direct.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(direct.status().message()).find(c.message), std::string::npos)
        << direct.status();
  }

  // Nothing was accepted, nothing spawned, no device taken.
  auto status = cluster.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE((*status)["jobs"].empty()) << status->dump();
  ASSERT_EQ((*status)["nodes"].size(), 1u);
  EXPECT_EQ((*status)["nodes"][0]["busy_devices"], 0);
  std::this_thread::sleep_for(300ms);  // a SpawnActors, had one been sent, would have landed
  std::error_code ec;
  EXPECT_TRUE(!fs::exists(cluster.dir() + "/actors", ec) ||
              fs::is_empty(cluster.dir() + "/actors", ec))
      << "an actor log was written";
  EXPECT_EQ(cluster.Log("agent-node-a").find("spawning"), std::string::npos)
      << cluster.Log("agent-node-a");
  EXPECT_FALSE(fs::exists(ckpt));
}

TEST(ClusterTrainTest, SubmitSendsTheSpecFolderAndTheWorkingDirectory) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  // No node: the job waits, which is all this test needs of it.
  const std::string spec =
      WriteTemp(cluster.dir() + "/specs", "ok.yaml", TrainYaml("folders", "ckpt/run"));
  auto result = RunShardline(
      {"submit", spec, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto status = cluster.Status();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ((*status)["jobs"].size(), 1u);
  const json job = (*status)["jobs"][0];
  EXPECT_EQ(job["kind"], "train");
  EXPECT_EQ(job["state"], "pending");
  EXPECT_EQ(job["world_size"], 4);
  // checkpoint.dir is relative to where `shardline submit` ran (this test's directory).
  EXPECT_EQ(job["train"]["checkpoint_dir"],
            (fs::current_path() / "ckpt/run").lexically_normal().string());
  EXPECT_EQ(job["train"]["steps"], 20);
  EXPECT_EQ(job["train"]["step"], 0);
  EXPECT_EQ(job["train"]["last_committed_step"], -1);
  EXPECT_EQ(job["train"]["plan"]["tp"], 2);
  EXPECT_EQ(job["train"]["plan"]["pp"], 2);
  EXPECT_EQ(job["train"]["plan"]["dp"], 1);
  EXPECT_EQ(job["train"]["plan"]["zero"], 1);
  EXPECT_EQ(job["train"]["plan"]["micro_batch"], 4);
  auto shown = RunShardline(
      {"status", job["job_id"], "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()});
  EXPECT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_NE(shown.output.find("step 0/20"), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("plan tp 2 x pp 2 x dp 1, zero 1, micro-batch 4"), std::string::npos)
      << shown.output;
}

TEST(ClusterTrainTest, ProgressAndCheckpointCommitWithEveryGroup) {
  LocalCluster cluster(PatientCluster());
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  auto node = FakeNode::Register(cluster, "fake", 4);
  ASSERT_TRUE(node.ok()) << node.status();
  // The spec's checkpoint dir is relative: it lands under the submitter's working directory.
  const std::string work_dir = cluster.dir() + "/work";
  const std::string ckpt = work_dir + "/ckpt";
  fs::create_directories(work_dir);
  auto job_id =
      SubmitFrom(cluster, TrainYaml("commit", "ckpt"), cluster.dir() + "/specs", work_dir);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto actors = StartActors(cluster, **node, *job_id, 4);
  ASSERT_EQ(actors.size(), 4u);

  // The Assignment: every group of every dimension, the folders, the kind.
  auto grid = placement::RankGrid::Create(2, 2, 1);
  ASSERT_TRUE(grid.ok());
  const auto expected = grid->AllGroups();
  for (const auto& actor : actors) {
    EXPECT_EQ(actor->kind(), "train");
    EXPECT_EQ(actor->world_size(), 4u);
    EXPECT_EQ(actor->spec_dir(), cluster.dir() + "/specs");
    EXPECT_EQ(actor->work_dir(), work_dir);
    ASSERT_EQ(actor->groups().size(), expected.size());  // world, 2 tp, 2 pp, 2 dp (of one)
    for (size_t g = 0; g < expected.size(); ++g) {
      EXPECT_EQ(actor->groups()[g].kind, expected[g].kind);
      EXPECT_EQ(actor->groups()[g].id, expected[g].id);
      EXPECT_EQ(actor->groups()[g].ranks,
                std::vector<uint32_t>(expected[g].ranks.begin(), expected[g].ranks.end()));
    }
  }
  auto running = cluster.WaitForJob(
      *job_id, [](const json& j) { return j["phase"] == "running"; }, 10s);
  ASSERT_TRUE(running.ok()) << running.status();

  // Step 10 from every rank: only the last stage has a loss; rank 1 is the slowest.
  // Network bytes per step: rank 2 moved the most (a bad figure from rank 3 is no measurement).
  ASSERT_TRUE(actors[0]
                  ->Report(10, kNaN, 900, 0.10, 0.02, 0.01, std::array<double, 4>{0, 2e6, 1e5, 0})
                  .ok());
  ASSERT_TRUE(actors[1]->Report(10, kNaN, 500, 0.20, 0.05, 0.05).ok());
  ASSERT_TRUE(
      actors[2]
          ->Report(10, 3.25, 950, 0.10, 0.01, 0.02, std::array<double, 4>{0, 12.1e6, 0.2e6, 0})
          .ok());
  ASSERT_TRUE(actors[3]
                  ->Report(10, 3.5, 950, 0.10, 0.01, 0.02, std::array<double, 4>{0, -1, 1e12, 0})
                  .ok());
  auto progress = cluster.Job(*job_id);
  ASSERT_TRUE(progress.ok());
  json train = (*progress)["train"];
  EXPECT_EQ(train["step"], 10);
  EXPECT_DOUBLE_EQ(train["loss"].get<double>(), 3.5) << "rank world-1's loss wins";
  EXPECT_DOUBLE_EQ(train["tokens_per_second"].get<double>(), 500);
  EXPECT_DOUBLE_EQ(train["compute_seconds"].get<double>(), 0.20);
  EXPECT_DOUBLE_EQ(train["comm_seconds"].get<double>(), 0.05);
  EXPECT_DOUBLE_EQ(train["bubble_seconds"].get<double>(), 0.05);
  ASSERT_TRUE(train["network_bytes_per_step"].is_object()) << train.dump(2);
  EXPECT_DOUBLE_EQ(train["network_bytes_per_step"]["tp"].get<double>(), 12.1e6);
  EXPECT_DOUBLE_EQ(train["network_bytes_per_step"]["pp"].get<double>(), 0.2e6);
  EXPECT_DOUBLE_EQ(train["network_bytes_per_step"]["dp"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(train["network_bytes_per_step"]["total"].get<double>(), 12.3e6);
  {
    auto shown = RunShardline(
        {"status", *job_id, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()});
    EXPECT_EQ(shown.exit_code, 0) << shown.output;
    EXPECT_NE(shown.output.find("network 12.3 MB/step (tp 12.1 MB, pp 200 kB)"), std::string::npos)
        << shown.output;
    EXPECT_NE(shown.output.find("/ waiting on comm 17% /"), std::string::npos) << shown.output;
  }
  // One step seen: the ETA comes from tokens/s: 10 steps x 4 x 8 tokens at 500 tokens/s.
  EXPECT_NEAR(train["eta_seconds"].get<double>(), 10 * 32 / 500.0, 1e-9);
  const std::string metrics = cluster.metrics_address();
  const std::string job_label = "job=\"" + *job_id + "\"";
  bool exported = false;
  for (int i = 0; i < 100 && !exported; ++i) {
    exported = ScrapeSum(metrics, "shardline_train_step", job_label) == 10;
    if (!exported) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(exported);
  EXPECT_DOUBLE_EQ(ScrapeSum(metrics, "shardline_train_loss", job_label), 3.5);
  EXPECT_DOUBLE_EQ(ScrapeSum(metrics, "shardline_train_tokens_per_second", job_label), 500);

  // Bad ShardSaved messages are answered with an error and change nothing.
  const std::string step10 = StepDir(ckpt, 10);
  fs::create_directories(step10);
  const auto refused = [&](const absl::Status& status, absl::StatusCode code,
                           const std::string& words) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_NE(std::string(status.message()).find(words), std::string::npos) << status;
  };
  // Rank 0 speaking for another job, generation or rank: its token is not theirs.
  refused(actors[0]->SaveShard(10, step10, "rank-0.safetensors", ShardOf(0), "no-such-job"),
          absl::StatusCode::kPermissionDenied, "no actor token was given for rank 0 of job no-such-job");
  refused(actors[0]->SaveShard(10, step10, "rank-0.safetensors", ShardOf(0), "", 7),
          absl::StatusCode::kPermissionDenied, "generation 7");
  refused(actors[0]->SaveShard(10, step10, "rank-0.safetensors", ShardOf(0), "", -1, 9),
          absl::StatusCode::kPermissionDenied, "rank 9 of job");
  refused(actors[0]->SaveShard(10, step10, "rank-0.safetensors", ShardOf(0), "", -1, 1),
          absl::StatusCode::kPermissionDenied, "does not match rank 1");
  refused(actors[0]->SaveShard(10, step10, "rank-0.safetensors",
                               {{"wte", {260, 8}, {200, 0}, {130, 8}}}),
          absl::StatusCode::kInvalidArgument, "does not fit in the global shape [260, 8]");
  refused(
      actors[0]->SaveShard(10, step10, "rank-0.safetensors", {{"wte", {260, 8}, {0}, {130, 8}}}),
      absl::StatusCode::kInvalidArgument, "do not match the rank");
  refused(actors[0]->SaveShard(10, step10, "rank-0.safetensors",
                               {{"wte", {260, 8}, {0, 0}, {130, 8}, "F33"}}),
          absl::StatusCode::kInvalidArgument, "unknown dtype");
  refused(actors[0]->SaveShard(10, cluster.dir() + "/elsewhere", "rank-0.safetensors", ShardOf(0)),
          absl::StatusCode::kInvalidArgument, "the step's folder is " + step10);
  refused(actors[0]->SaveShard(10, step10, "../rank-0.safetensors", ShardOf(0)),
          absl::StatusCode::kInvalidArgument, "a name inside the step's folder");
  refused(actors[0]->SaveShard(21, StepDir(ckpt, 21), "rank-0.safetensors", ShardOf(0)),
          absl::StatusCode::kInvalidArgument, "only 20 steps");

  // Step 10, rank by rank: nothing is committed until the last one.
  for (uint32_t rank = 0; rank < 4; ++rank) {
    EXPECT_FALSE(fs::exists(step10 + "/manifest.json")) << "committed before rank " << rank;
    EXPECT_FALSE(fs::exists(ckpt + "/latest"));
    // (Rank 3 names the folder with a trailing slash: the same folder.)
    ASSERT_TRUE(actors[rank]
                    ->SaveShard(10, rank == 3 ? step10 + "/" : step10,
                                "rank-" + std::to_string(rank) + ".safetensors", ShardOf(rank))
                    .ok());
    if (rank == 1) {
      // A second report of the same shard, and one that disagrees with rank 0 on wte's shape.
      refused(actors[1]->SaveShard(10, step10, "rank-1.safetensors", ShardOf(1)),
              absl::StatusCode::kAlreadyExists, "already reported");
      refused(actors[2]->SaveShard(10, step10, "rank-2.safetensors",
                                   {{"wte", {261, 8}, {0, 0}, {261, 8}}}),
              absl::StatusCode::kInvalidArgument, "disagrees with rank 0");
    }
  }
  EXPECT_EQ(ReadFile(ckpt + "/latest"), "step-00000010\n");
  // The manifest is what the checkpoint library reads: parse and validate it with it.
  auto manifest = checkpoint::ReadManifest(step10 + "/manifest.json");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 10);
  EXPECT_EQ(manifest->world_size, 4);
  EXPECT_EQ(manifest->metadata.at("format"), "shardline");
  EXPECT_EQ(manifest->metadata.at("model"), "gpt2");
  EXPECT_EQ(manifest->metadata.at("n_layer"), "2");
  EXPECT_EQ(manifest->metadata.at("n_embd"), "8");
  EXPECT_EQ(manifest->metadata.at("n_head"), "4");
  EXPECT_EQ(manifest->metadata.at("d_ff"), "32");
  EXPECT_EQ(manifest->metadata.at("vocab_size"), "260");
  EXPECT_EQ(manifest->metadata.at("n_positions"), "8");
  EXPECT_EQ(manifest->metadata.at("tied_embeddings"), "true");
  ASSERT_EQ(manifest->tensors.size(), 4u);
  const auto& wte = manifest->tensors.at("wte");
  EXPECT_EQ(wte.global_shape, (std::vector<int64_t>{260, 8}));
  ASSERT_EQ(wte.shards.size(), 2u);
  EXPECT_EQ(wte.shards[1].rank, 1);
  EXPECT_EQ(wte.shards[1].file, "rank-1.safetensors");
  EXPECT_EQ(wte.shards[1].tensor, "wte");
  EXPECT_EQ(wte.shards[1].offsets, (std::vector<int64_t>{130, 0}));
  EXPECT_EQ(manifest->tensors.at("lnf.w").shards.size(), 2u);  // tp replicas
  progress = cluster.Job(*job_id);
  ASSERT_TRUE(progress.ok());
  EXPECT_EQ((*progress)["train"]["last_committed_step"], 10);
  EXPECT_EQ((*progress)["train"]["checkpoint_dir"], ckpt);
  // A committed step cannot be saved again.
  refused(actors[0]->SaveShard(10, step10, "rank-0.safetensors", ShardOf(0)),
          absl::StatusCode::kFailedPrecondition, "already committed");

  // Step 20 (the last): progress moves, the ETA ends, the second commit moves latest.
  for (auto& actor : actors) {
    ASSERT_TRUE(actor->Report(20, actor->rank() == 3 ? 2.75 : kNaN, 1000, 0.1, 0.01, 0.01).ok());
  }
  const std::string step20 = StepDir(ckpt, 20);
  fs::create_directories(step20);
  for (auto& actor : actors) {
    ASSERT_TRUE(actor
                    ->SaveShard(20, step20,
                                "rank-" + std::to_string(actor->rank()) + ".safetensors",
                                ShardOf(actor->rank()))
                    .ok());
  }
  EXPECT_EQ(ReadFile(ckpt + "/latest"), "step-00000020\n");
  EXPECT_TRUE(checkpoint::ReadManifest(step20 + "/manifest.json").ok());
  progress = cluster.Job(*job_id);
  ASSERT_TRUE(progress.ok());
  EXPECT_EQ((*progress)["train"]["step"], 20);
  EXPECT_DOUBLE_EQ((*progress)["train"]["loss"].get<double>(), 2.75);
  EXPECT_EQ((*progress)["train"]["eta_seconds"], 0);
  EXPECT_EQ((*progress)["train"]["last_committed_step"], 20);
  auto shown = RunShardline(
      {"status", *job_id, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()});
  EXPECT_NE(shown.output.find("step 20/20  loss 2.7500"), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("checkpoint: step 20 in " + ckpt), std::string::npos) << shown.output;

  // Every rank done: the job succeeds, and its gauges go away with it.
  for (auto& actor : actors) ASSERT_TRUE(actor->Done(true, "trained").ok());
  auto done = cluster.WaitForJobEnd(*job_id, 10s);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ((*done)["state"], "succeeded") << done->dump();
  bool removed = false;
  for (int i = 0; i < 100 && !removed; ++i) {
    removed = ScrapeSum(metrics, "shardline_train_step", job_label) == -1;
    if (!removed) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(removed);
}

TEST(ClusterTrainTest, ShardsThatDoNotCoverATensorFailTheJobAndCommitNothing) {
  LocalCluster cluster(PatientCluster());
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  auto node = FakeNode::Register(cluster, "fake", 4);
  ASSERT_TRUE(node.ok()) << node.status();
  const std::string ckpt = cluster.dir() + "/ckpt";
  auto job_id = SubmitFrom(cluster, TrainYaml("holes", ckpt), cluster.dir(), cluster.dir());
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto actors = StartActors(cluster, **node, *job_id, 4);
  ASSERT_EQ(actors.size(), 4u);
  const std::string step10 = StepDir(ckpt, 10);
  fs::create_directories(step10);
  // Rank 1 claims the same wte rows as rank 0: rows 130..259 are held by no one.
  for (auto& actor : actors) {
    auto tensors = ShardOf(actor->rank());
    if (actor->rank() == 1) tensors[0].offsets = {0, 0};
    const absl::Status status = actor->SaveShard(
        10, step10, "rank-" + std::to_string(actor->rank()) + ".safetensors", tensors);
    if (actor->rank() < 3) {
      ASSERT_TRUE(status.ok()) << status;
    } else {
      EXPECT_FALSE(status.ok()) << "the last shard completes the step, whose commit fails";
    }
  }
  auto failed = cluster.WaitForJobEnd(*job_id, 10s);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ((*failed)["state"], "failed");
  const std::string error = (*failed)["error"];
  EXPECT_NE(error.find("checkpoint step 10 could not be committed"), std::string::npos) << error;
  EXPECT_NE(error.find("tensor 'wte'"), std::string::npos) << error;
  EXPECT_NE(error.find("shards cover 1040 of 2080 elements"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(step10 + "/manifest.json"));
  EXPECT_FALSE(fs::exists(ckpt + "/latest"));
  EXPECT_EQ((*failed)["train"]["last_committed_step"], -1);
}

TEST(ClusterTrainTest, BootstrapDeadlineNamesTheMissingRankInEveryGroup) {
  LocalCluster cluster(PatientCluster());
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  auto node = FakeNode::Register(cluster, "fake", 4);
  ASSERT_TRUE(node.ok()) << node.status();
  auto job_id = SubmitFrom(cluster,
                           TrainYaml("late", cluster.dir() + "/ckpt", "  tp: 2\n  pp: 2\n  dp: 1\n",
                                     "bootstrap_timeout_s: 3\n"),
                           cluster.dir(), cluster.dir());
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto spawn = (*node)->WaitForSpawn(*job_id, 20s);
  ASSERT_TRUE(spawn.ok()) << spawn.status();
  // Ranks 0-2 come and bootstrap every group they are in; rank 3 never registers.
  std::vector<std::unique_ptr<FakeActor>> actors;
  for (uint32_t rank = 0; rank < 3; ++rank) {
    auto actor = FakeActor::Register(cluster, *job_id, spawn->first, rank, "fake",
                                     (*node)->token(spawn->first, rank));
    ASSERT_TRUE(actor.ok()) << actor.status();
    actors.push_back(std::move(*actor));
  }
  for (auto& actor : actors) {
    const absl::Status joined = actor->JoinAllGroups();
    EXPECT_TRUE(joined.ok()) << joined;
  }
  auto failed = cluster.WaitForJobEnd(*job_id, 20s);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ((*failed)["state"], "failed");
  const std::string error = (*failed)["error"];
  auto grid = placement::RankGrid::Create(2, 2, 1);
  ASSERT_TRUE(grid.ok());
  // Rank 3's groups each name it; the groups without it (the dp group of one of rank 0, ...)
  // were complete and are not mentioned.
  for (const auto& group : grid->GroupsOf(3)) {
    EXPECT_NE(
        error.find("group " + group.id + " is missing rank 3 (node fake, cpu:3, never registered)"),
        std::string::npos)
        << group.id << ": " << error;
  }
  for (const auto& group : grid->GroupsOf(0)) {
    if (group.kind == "world") continue;
    const bool has_three =
        std::find(group.ranks.begin(), group.ranks.end(), 3) != group.ranks.end();
    if (!has_three) {
      EXPECT_EQ(error.find("group " + group.id + " "), std::string::npos) << error;
    }
  }
}

TEST(ClusterTrainTest, ANodeRegisteringAgainWithAnotherDeviceSetIsNewCapacityNotMerged) {
  LocalCluster cluster(PatientCluster());
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  auto node = FakeNode::Register(cluster, "fake", 4);
  ASSERT_TRUE(node.ok()) << node.status();
  auto job_id = SubmitFrom(cluster, TrainYaml("regrown", cluster.dir() + "/ckpt"), cluster.dir(),
                           cluster.dir());
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto actors = StartActors(cluster, **node, *job_id, 4);
  ASSERT_EQ(actors.size(), 4u);
  // The same agent with the same devices (a lost reply): the generation keeps them.
  ASSERT_TRUE((*node)->SendRegistration(4).ok());
  auto job = cluster.Job(*job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*job)["state"], "running") << job->dump();
  EXPECT_EQ((*job)["generation"], 1);
  // Another device set: the generation placed on the old one fails, naming why, and the six
  // devices are free capacity, none of them held by the failed generation.
  ASSERT_TRUE((*node)->SendRegistration(6).ok());
  auto failed = cluster.WaitForJobEnd(*job_id, 10s);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ((*failed)["state"], "failed");
  const std::string error = (*failed)["error"];
  EXPECT_NE(error.find("its agent registered again with another device set"), std::string::npos)
      << error;
  auto status = cluster.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ((*status)["nodes"].size(), 1u);
  EXPECT_EQ((*status)["nodes"][0]["devices"].size(), 6u) << status->dump();
  EXPECT_EQ((*status)["nodes"][0]["busy_devices"], 0) << status->dump();
}

}  // namespace
}  // namespace shardline::testing
