// Loading a GPT from a sharded checkpoint: the rank files a tp=2 x pp=2 job writes (written here
// by hand, as docs/checkpoint-format.md lays them out) load into the same parameters, bit for bit,
// as the single file of the same model; ReadCheckpointBox gives every box of every tensor from
// either kind; broken checkpoints are errors naming the file and the tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors_writer.h"
#include "common/status_macros.h"
#include "tests/support/box_reference.h"
#include "worker/model/model_params.h"
#include "worker/training/model_checkpoint.h"

namespace shardline::training {
namespace {

namespace fs = std::filesystem;
using checkpoint::HostTensor;
using checkpoint::Manifest;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string TempDir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("shardline-sharded-model-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

constexpr int kTp = 2;
constexpr int kPp = 2;
constexpr int64_t kStep = 7;

// 4 layers (2 per stage), 2 heads (one per tensor-parallel rank), C = 16, F = 64, and a vocabulary
// of 257 that splits unevenly, 129 + 128.
model::ModelConfig TinyConfig(bool tied) {
  model::ModelConfig config;
  config.layers = 4;
  config.heads = 2;
  config.d_model = 16;
  config.vocab = 257;
  config.max_seq_len = 16;
  config.tied_embeddings = tied;
  return config;
}

std::unique_ptr<model::ModelParams> TinyModel(bool tied) {
  auto gpt = model::ModelParams::Gpt2Init(TinyConfig(tied), 5);
  EXPECT_TRUE(gpt.ok()) << gpt.status();
  // LayerNorm weights and biases start constant; make every element distinct so that a misplaced
  // one shows.
  std::span<float> params = gpt->values();
  for (size_t i = 0; i < params.size(); ++i) params[i] += 1e-3f * static_cast<float>(i % 977);
  return std::make_unique<model::ModelParams>(std::move(*gpt));
}

std::vector<float> Slice(std::span<const float> full, const std::vector<int64_t>& global,
                         const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape) {
  return shardline::testing::ReferenceBox(full, global, offsets, shape);
}

// The global shape of `name` in a sharded checkpoint: the model's, but (3, C, C) / (3, C) for qkv.
std::vector<int64_t> ShardedShape(const model::ParamTensorInfo& info, int64_t c) {
  if (info.name.ends_with("qkv.w")) return {3, c, c};
  if (info.name.ends_with("qkv.b")) return {3, c};
  return info.shape;
}

std::string RankFile(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.safetensors", rank);
  return name;
}

// What a tp=2 x pp=2 job writes for `gpt` (rank = tp + 2·pp, DESIGN.md): stage 0 holds wte, wpe
// and layers 0-1, stage 1 layers 2-3, lnf and the head: for a tied head a replica of wte's
// vocabulary rows, else lm_head.w. Within a stage, tensor-parallel rank t holds head t of qkv
// (the box [0:3, 8t:8t+8, 0:16] of (3, C, C)), rows of fc, columns of attn_proj.w and fc_proj.w,
// vocabulary rows of wte/lm_head (129 | 128), and a replica of the LayerNorms, wpe and the
// row-parallel biases.
class ShardedJob {
 public:
  explicit ShardedJob(const model::ModelParams& gpt) : gpt_(gpt) {
    manifest_.step = kStep;
    manifest_.world_size = kTp * kPp;
    const model::ModelConfig& config = gpt.config();
    model::ModelConfig meta;
    meta.layers = config.layers;
    meta.d_model = config.d_model;
    meta.heads = config.heads;
    meta.d_ff = config.ff();
    meta.vocab = config.vocab;
    meta.max_seq_len = config.max_seq_len;
    meta.tied_embeddings = config.tied_embeddings;
    manifest_.metadata = checkpoint::ModelMetadata(meta);
    const int64_t C = config.d_model, F = config.ff(), V = config.vocab;
    const int64_t vocab_rows[kTp + 1] = {0, 129, V};
    for (const model::ParamTensorInfo& info : gpt.layout().tensors()) {
      const std::string& n = info.name;
      const std::vector<int64_t> global = ShardedShape(info, C);
      for (int pp = 0; pp < kPp; ++pp) {
        const bool holds = n == "wte" || n == "wpe"
                               ? pp == 0 || (n == "wte" && config.tied_embeddings && pp == 1)
                           : n.starts_with("h.") ? (std::stoi(n.substr(2)) / 2 == pp)
                                                 : pp == 1;  // lnf, lm_head.w
        if (!holds) continue;
        for (int t = 0; t < kTp; ++t) {
          const int rank = t + kTp * pp;
          std::vector<int64_t> offsets(global.size(), 0), shape = global;
          if (n == "wte" || n == "lm_head.w") {
            offsets[0] = vocab_rows[t];
            shape[0] = vocab_rows[t + 1] - vocab_rows[t];
          } else if (n.ends_with("qkv.w") || n.ends_with("qkv.b")) {
            offsets[1] = t * C / 2;
            shape[1] = C / 2;
          } else if (n.ends_with("fc.w") || n.ends_with("fc.b")) {
            offsets[0] = t * F / 2;
            shape[0] = F / 2;
          } else if (n.ends_with("attn_proj.w")) {
            offsets[1] = t * C / 2;
            shape[1] = C / 2;
          } else if (n.ends_with("fc_proj.w")) {
            offsets[1] = t * F / 2;
            shape[1] = F / 2;
          }  // everything else is replicated whole
          Add(n, global, rank, offsets, shape);
        }
      }
    }
  }

  Manifest& manifest() { return manifest_; }
  std::map<int, std::map<std::string, HostTensor>>& files() { return files_; }

  // DIR/step-00000007/{rank-0000R.safetensors, manifest.json} and DIR/latest.
  void Write(const std::string& dir) {
    const fs::path step = fs::path(dir) / "step-00000007";
    fs::create_directories(step);
    for (const auto& [rank, tensors] : files_) {
      checkpoint::SafetensorsWriter writer((step / RankFile(rank)).string());
      for (const auto& [name, tensor] : tensors) ASSERT_TRUE(writer.Add(tensor.View(name)).ok());
      auto written = writer.Finish();
      ASSERT_TRUE(written.ok()) << written.status();
      manifest_.files[RankFile(rank)] = {rank, written->bytes, written->xxh3};
      for (auto& [name, tensor] : manifest_.tensors) {
        for (checkpoint::ShardSlice& slice : tensor.shards) {
          if (slice.file == RankFile(rank)) slice.xxh3 = written->tensor_xxh3.at(slice.tensor);
        }
      }
    }
    ASSERT_TRUE(checkpoint::WriteManifest(checkpoint::DefaultFileSystem(),
                                          (step / "manifest.json").string(), manifest_)
                    .ok());
    std::ofstream(fs::path(dir) / "latest") << "step-00000007\n";
  }

 private:
  void Add(const std::string& name, const std::vector<int64_t>& global, int rank,
           const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape) {
    auto full = gpt_.values().subspan(gpt_.layout().Find(name)->offset);
    files_[rank][name] = HostTensor{shape, Slice(full, global, offsets, shape)};
    checkpoint::ManifestTensor& tensor = manifest_.tensors[name];
    tensor.global_shape = global;
    tensor.shards.push_back({rank, RankFile(rank), name, offsets, shape});
  }

  const model::ModelParams& gpt_;
  Manifest manifest_;
  std::map<int, std::map<std::string, HostTensor>> files_;
};

void ExpectSameParameters(const model::ModelParams& a, const model::ModelParams& b) {
  ASSERT_EQ(a.config().DebugString(), b.config().DebugString());
  ASSERT_EQ(a.values().size(), b.values().size());
  EXPECT_EQ(0,
            std::memcmp(a.values().data(), b.values().data(), sizeof(float) * a.values().size()));
}

class ShardedCheckpointTest : public ::testing::TestWithParam<bool> {};

TEST_P(ShardedCheckpointTest, LoadsBitIdenticalToTheSingleFile) {
  const bool tied = GetParam();
  const std::string dir = TempDir(tied ? "load-tied" : "load-untied");
  const auto original = TinyModel(tied);
  const std::string single = dir + "/single/step-00000003/model.safetensors";
  ASSERT_TRUE(SaveModel(*original, single).ok());
  ShardedJob job(*original);
  job.Write(dir + "/run");

  absl::StatusOr<std::string> resolved = checkpoint::ResolveCheckpoint(dir + "/run");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, dir + "/run/step-00000007/manifest.json");
  absl::StatusOr<std::string> step_folder = checkpoint::ResolveCheckpoint(dir + "/run/step-00000007");
  ASSERT_TRUE(step_folder.ok()) << step_folder.status();
  EXPECT_EQ(*step_folder, *resolved);

  auto from_file = LoadModel(single);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  ExpectSameParameters(*from_file, *original);
  // The run folder, the step folder and the manifest itself all name the same checkpoint.
  for (const std::string& path :
       {dir + "/run", dir + "/run/step-00000007", dir + "/run/step-00000007/manifest.json"}) {
    auto loaded = LoadModel(path);
    ASSERT_TRUE(loaded.ok()) << path << ": " << loaded.status();
    EXPECT_EQ(loaded->config().tied_embeddings, tied);
    ExpectSameParameters(*loaded, *original);
  }
  fs::remove_all(dir);
}

TEST_P(ShardedCheckpointTest, EveryBoxEqualsTheSliceFromEitherKind) {
  const bool tied = GetParam();
  const std::string dir = TempDir(tied ? "box-tied" : "box-untied");
  const auto original = TinyModel(tied);
  ASSERT_TRUE(SaveModel(*original, dir + "/single/step-00000003/model.safetensors").ok());
  ShardedJob job(*original);
  job.Write(dir + "/run");

  absl::StatusOr<CheckpointSource> single = CheckpointSource::Open(dir + "/single/step-00000003");
  ASSERT_TRUE(single.ok()) << single.status();
  absl::StatusOr<CheckpointSource> sharded = CheckpointSource::Open(dir + "/run");
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(single->kind(), CheckpointKind::kSingleFile);
  EXPECT_EQ(sharded->kind(), CheckpointKind::kSharded);
  EXPECT_FALSE(single->step().has_value()) << "a model file is not a step of a run";
  EXPECT_EQ(sharded->step(), kStep);
  const model::ModelConfig expected = TinyConfig(tied);
  for (const CheckpointSource* source : {&*single, &*sharded}) {
    EXPECT_EQ(source->config().DebugString(), expected.DebugString());
  }

  std::mt19937 rng(3);
  const int64_t C = expected.d_model;
  for (const model::ParamTensorInfo& info : original->layout().tensors()) {
    const std::vector<int64_t> global = ShardedShape(info, C);
    const auto full = original->values().subspan(info.offset, info.numel);
    for (const CheckpointSource* source : {&*single, &*sharded}) {
      absl::StatusOr<std::vector<int64_t>> box_shape = source->BoxShape(info.name);
      ASSERT_TRUE(box_shape.ok()) << box_shape.status();
      EXPECT_EQ(*box_shape, global) << info.name;
    }
    for (int trial = 0; trial < 25; ++trial) {
      std::vector<int64_t> offsets, shape;
      for (int64_t size : global) {
        int64_t a = std::uniform_int_distribution<int64_t>(0, size)(rng);
        int64_t b = std::uniform_int_distribution<int64_t>(0, size)(rng);
        if (a > b) std::swap(a, b);
        offsets.push_back(a);
        shape.push_back(b - a);
      }
      const std::vector<float> want = Slice(full, global, offsets, shape);
      for (const CheckpointSource* source : {&*single, &*sharded}) {
        absl::StatusOr<std::vector<float>> box =
            ReadCheckpointBox(*source, info.name, offsets, shape);
        ASSERT_TRUE(box.ok()) << box.status();
        ASSERT_EQ(*box, want) << info.name << " at " << checkpoint::ShapeString(offsets)
                              << " of shape " << checkpoint::ShapeString(shape);
      }
    }
  }
  // The box a tensor-parallel rank of another plan would load: head 1 of a layer's qkv, which is
  // rows [8:16), [24:32) and [40:48) of the model's (3C, C).
  const std::vector<int64_t> offsets = {0, 8, 0}, shape = {3, 8, 16};
  absl::StatusOr<std::vector<float>> head =
      ReadCheckpointBox(*sharded, "h.2.qkv.w", offsets, shape);
  ASSERT_TRUE(head.ok()) << head.status();
  const auto qkv = original->values().subspan(original->layout().Find("h.2.qkv.w")->offset);
  for (int64_t part = 0; part < 3; ++part) {
    for (int64_t row = 0; row < 8; ++row) {
      ASSERT_EQ(0, std::memcmp(head->data() + (part * 8 + row) * C,
                               qkv.data() + (part * C + 8 + row) * C, sizeof(float) * C));
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, ShardedCheckpointTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tied" : "Untied";
                         });

TEST(ShardedCheckpointErrorsTest, AMissingShardFileNamesItAndTheTensor) {
  const std::string dir = TempDir("missing");
  const auto original = TinyModel(true);
  ShardedJob job(*original);
  job.Write(dir);
  const std::string step = dir + "/step-00000007";
  fs::remove(step + "/" + RankFile(3));
  auto loaded = LoadModel(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  // Rank 3 (stage 1, tensor-parallel rank 1) is first needed for layer 2's second head.
  EXPECT_THAT(Message(loaded.status()),
              AllOf(HasSubstr(step + "/manifest.json"), HasSubstr("rank-00003.safetensors"),
                    HasSubstr("tensor 'h.2.")));
  absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(dir);
  ASSERT_TRUE(source.ok()) << source.status();
  const std::vector<int64_t> offsets = {32, 0}, shape = {32, 16};
  EXPECT_THAT(Message(ReadCheckpointBox(*source, "h.3.fc.w", offsets, shape).status()),
              AllOf(HasSubstr("tensor 'h.3.fc.w'"), HasSubstr("rank-00003.safetensors")));
  // Rank 2 alone serves the other half, and the tied head's replica of wte on rank 3 is not
  // needed: rank 1 has those rows.
  const std::vector<int64_t> first_half = {0, 0};
  EXPECT_TRUE(ReadCheckpointBox(*source, "h.3.fc.w", first_half, shape).ok());
  const std::vector<int64_t> wte_offsets = {0, 0}, wte_shape = {257, 16};
  EXPECT_TRUE(ReadCheckpointBox(*source, "wte", wte_offsets, wte_shape).ok());
  fs::remove_all(dir);
}

TEST(ShardedCheckpointErrorsTest, AShardWithTheWrongShapeNamesItAndTheTensor) {
  const std::string dir = TempDir("shape");
  const auto original = TinyModel(true);
  ShardedJob job(*original);
  // Rank 1 wrote 31 rows of h.0.fc.w where the manifest says 32.
  HostTensor& fc = job.files()[1]["h.0.fc.w"];
  fc.shape = {31, 16};
  fc.values.resize(31 * 16);
  job.Write(dir);
  auto loaded = LoadModel(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(Message(loaded.status()),
              AllOf(HasSubstr("manifest.json"), HasSubstr("rank-00001.safetensors"),
                    HasSubstr("tensor 'h.0.fc.w'"), HasSubstr("has shape [31, 16]"),
                    HasSubstr("[32, 16]")));
  fs::remove_all(dir);
}

TEST(ShardedCheckpointErrorsTest, AManifestWithAHoleNamesTheTensor) {
  const std::string dir = TempDir("hole");
  const auto original = TinyModel(true);
  ShardedJob job(*original);
  job.Write(dir);
  // Drop tensor-parallel rank 1's rows of h.1.fc.w; WriteManifest would refuse, so write the text.
  job.manifest().tensors["h.1.fc.w"].shards.pop_back();
  std::ofstream(dir + "/step-00000007/manifest.json") << checkpoint::ManifestToJson(job.manifest());
  auto loaded = LoadModel(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(Message(loaded.status()),
              AllOf(HasSubstr(dir + "/step-00000007/manifest.json"), HasSubstr("tensor 'h.1.fc.w'"),
                    HasSubstr("cover 512 of 1024")));
  fs::remove_all(dir);
}

TEST(ShardedCheckpointErrorsTest, MetadataAndTensorsThatDisagreeAreErrors) {
  const auto original = TinyModel(false);
  // An untied model whose metadata claims a tied head: lm_head.w must not be silently dropped.
  {
    const std::string dir = TempDir("tied-claim");
    ShardedJob job(*original);
    job.manifest().metadata["tied_embeddings"] = "true";
    job.Write(dir);
    EXPECT_THAT(Message(LoadModel(dir).status()),
                AllOf(HasSubstr("tensor 'lm_head.w'"), HasSubstr("not a parameter")));
    fs::remove_all(dir);
  }
  // The fused QKV in the model's (3C, C) rather than the sharded (3, C, C).
  {
    const std::string dir = TempDir("qkv-layout");
    ShardedJob job(*original);
    checkpoint::ManifestTensor& qkv = job.manifest().tensors["h.0.qkv.w"];
    qkv.global_shape = {48, 16};
    for (int t = 0; t < kTp; ++t) {
      job.files()[t]["h.0.qkv.w"].shape = {24, 16};
      qkv.shards[t].offsets = {24 * t, 0};
      qkv.shards[t].shape = {24, 16};
    }
    job.Write(dir);
    EXPECT_THAT(Message(LoadModel(dir).status()),
                AllOf(HasSubstr("tensor 'h.0.qkv.w'"), HasSubstr("[48, 16]"),
                      HasSubstr("expected [3, 16, 16]")));
    fs::remove_all(dir);
  }
  // Optimizer state beside the parameters is not the model's business.
  {
    const std::string dir = TempDir("extra");
    ShardedJob job(*original);
    job.files()[0]["adam_m.wpe"] = HostTensor{{16, 16}, std::vector<float>(256, 0.5f)};
    job.manifest().tensors["adam_m.wpe"] = {checkpoint::SafetensorsDType::kF32,
                                            {16, 16},
                                            {{0, RankFile(0), "adam_m.wpe", {0, 0}, {16, 16}}}};
    job.Write(dir);
    auto loaded = LoadModel(dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectSameParameters(*loaded, *original);
    absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(dir);
    ASSERT_TRUE(source.ok()) << source.status();
    const std::vector<int64_t> offsets = {15, 15}, shape = {1, 1};
    absl::StatusOr<std::vector<float>> m = ReadCheckpointBox(*source, "adam_m.wpe", offsets, shape);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(*m, std::vector<float>{0.5f});
    fs::remove_all(dir);
  }
}

TEST(ShardedCheckpointErrorsTest, ResolveNamesWhatItLookedFor) {
  const std::string dir = TempDir("resolve");
  fs::create_directories(dir + "/step-00000001");
  std::ofstream(dir + "/latest") << "step-00000001\n";
  const absl::Status status = checkpoint::ResolveCheckpoint(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(dir + "/latest"), HasSubstr("step-00000001"),
                                     HasSubstr("holds no manifest.json")));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardline::training
