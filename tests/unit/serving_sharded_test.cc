// Tensor- and pipeline-parallel serving over real processes (forked ranks, shared-memory
// communicators through a FileStore), for (tp, pp) = (2,1), (3,1), (1,2), (2,2): vocab-parallel
// sampling gives SampleToken's tokens on the whole row; a rank's ShardWeights read through boxes
// give the whole model's logits (the last stage's slices); and a BatchingEngine on rank 0 with
// RunServingFollower on the others gives, for concurrent requests, the tokens each request gets
// from the single-device generator, with a step in flight per stage — and with an idle spell
// longer than the heartbeat in between. A
// follower whose leader dies returns an error instead of waiting forever.
//
// Every rank computes in its own child (the parent must not start OpenMP threads before forking).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "placement/parallel_layout.h"
#include "tests/support/forked_world.h"
#include "tests/support/test_models.h"
#include "worker/model/inference.h"
#include "worker/model/model_params.h"
#include "worker/model/paged_inference.h"
#include "worker/model/shard_layout.h"
#include "worker/model/vocab_parallel_sampling.h"
#include "worker/serving/batching_engine.h"
#include "worker/serving/serving_rank.h"

namespace shardline::serving {
namespace {

// Failures inside a child: print, and return an exit code the parent reports.
#define CHILD_CHECK(cond, code)                                                           \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "rank check failed (%s:%d): %s\n", __FILE__, __LINE__, #cond); \
      return code;                                                                        \
    }                                                                                     \
  } while (0)

// GPT-2's choices, or (llama_kv_heads > 0) Llama's with that many key/value heads.
model::ModelConfig Config(int llama_kv_heads = 0) {
  // 6 heads and d_ff 48 so that tp 3 divides them; a vocabulary 3 does not divide.
  model::ModelConfig config{
      .layers = 2, .heads = 6, .d_model = 24, .d_ff = 48, .vocab = 41, .max_seq_len = 32};
  if (llama_kv_heads > 0) {
    config = model::ModelConfig::Llama(config);
    config.kv_heads = llama_kv_heads;
  }
  return config;
}

std::unique_ptr<model::ModelParams> Model(int llama_kv_heads = 0) {
  // A hotter init than GPT-2's, so logits and attention vary enough to show a wrong shard.
  return std::make_unique<model::ModelParams>(
      testing::NoisyGpt2Init(Config(llama_kv_heads), 21, 5, 0.3f));
}

void RunWorld(int tp, int pp, const testing::RankBody& body, std::chrono::seconds deadline) {
  auto grid = placement::RankGrid::Create(tp, pp, 1);
  ASSERT_TRUE(grid.ok());
  const std::string dir = testing::MakeTempDir("shardline_serving_tp");
  ASSERT_FALSE(dir.empty());
  const testing::ForkedWorldResult result = testing::RunForkedWorld(*grid, dir, body, deadline);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(result.ok()) << "tp " << tp << " pp " << pp << ": " << result.Describe();
}

ServingGroups GroupsOf(const model::ShardedGroups& g) {
  return ServingGroups{.world = g.world, .tp = g.tp, .pp = g.pp};
}

bool IsLeader(const model::ShardedGroups& g) { return g.world == nullptr || g.world->rank() == 0; }

// This rank's part of Model(): its tensor-parallel index and pipeline stage.
absl::StatusOr<std::unique_ptr<model::ShardWeights>> Shard(const model::ModelParams& gpt, int tp,
                                                           int pp,
                                                           const placement::RankCoords& coords,
                                                           kernels::Backend& backend) {
  return model::ShardWeights::Load(gpt.config(), tp, coords.tp, model::ModelBoxReader(gpt), backend,
                                   pp, coords.pp);
}

struct Cut {
  int tp = 1, pp = 1;
  int llama_kv_heads = 0;  // > 0: a Llama with this many key/value heads (6 query heads)
};
void PrintTo(const Cut& cut, std::ostream* os) {
  *os << "tp " << cut.tp << " pp " << cut.pp << " llama kv " << cut.llama_kv_heads;
}

class ServingSamplingTest : public ::testing::TestWithParam<int> {};
class ServingShardedTest : public ::testing::TestWithParam<Cut> {};

TEST_P(ServingSamplingTest, VocabParallelSamplingGivesSampleTokensTokens) {
  const int tp = GetParam();
  RunWorld(
      tp, 1,
      [&](int rank, const placement::RankCoords&, const model::ShardedGroups& groups) {
        const model::ModelConfig c = Config();
        auto layout = model::ShardLayout::Create(
            c, {.tp_size = tp, .tp_index = rank, .chunks = {{0, static_cast<int>(c.layers)}}});
        CHILD_CHECK(layout.ok(), 2);
        const int v0 = layout->vocab_begin(), v1 = layout->vocab_end(), V = c.vocab;
        // Rows of every kind: greedy (with ties across ranks), the whole vocabulary, top-k
        // smaller and larger than a rank's slice, top-p alone and after top-k.
        std::mt19937 rng(17);
        std::normal_distribution<float> logit(0.0f, 2.0f);
        std::vector<model::RowSampling> rows;
        std::vector<float> full, local;
        for (int r = 0; r < 120; ++r) {
          model::RowSampling row{.options = {.temperature = 0.0f, .top_k = 0, .seed = 7u + r},
                                 .draw = uint64_t(r * 3)};
          if (r % 6 == 1) row.options.temperature = 0.7f;
          if (r % 6 == 2) row.options = {.temperature = 1.3f, .top_k = 3, .seed = 9u + r};
          if (r % 6 == 3) row.options = {.temperature = 0.9f, .top_k = 20, .seed = 11u + r};
          // Nucleus sampling over the whole vocabulary (narrow and wide), and after a top-k.
          if (r % 6 == 4) {
            row.options = {.temperature = 1.0f, .top_p = r % 12 == 4 ? 0.3f : 0.9f, .seed = 5u + r};
          }
          if (r % 6 == 5) {
            row.options = {.temperature = 0.8f, .top_k = 12, .top_p = 0.6f, .seed = 3u + r};
          }
          rows.push_back(row);
          std::vector<float> l(V);
          for (float& x : l) x = logit(rng);
          if (r % 8 == 0) l[0] = l[V - 1] = 50.0f;  // a tie between the first and last rank
          full.insert(full.end(), l.begin(), l.end());
          local.insert(local.end(), l.begin() + v0, l.begin() + v1);
        }
        auto tokens = model::SampleVocabParallel(local, v0, v1, V, rows, groups.tp);
        CHILD_CHECK(tokens.ok(), 3);
        for (size_t r = 0; r < rows.size(); ++r) {
          auto want =
              model::SampleToken(std::span(full).subspan(r * V, V), rows[r].options, rows[r].draw);
          CHILD_CHECK(want.ok(), 4);
          if ((*tokens)[r] != *want) {
            std::fprintf(stderr, "row %zu: vocab-parallel %d, SampleToken %d\n", r, (*tokens)[r],
                         *want);
            return 5;
          }
        }
        return 0;
      },
      std::chrono::seconds(60));
}

TEST_P(ServingShardedTest, ShardLogitsAreTheWholeModels) {
  // Not a structured binding: clang 14 (the sanitizer builds) cannot capture one in a lambda.
  const int tp = GetParam().tp, pp = GetParam().pp, kv_heads = GetParam().llama_kv_heads;
  RunWorld(
      tp, pp,
      [&](int, const placement::RankCoords& coords, const model::ShardedGroups& groups) {
        kernels::CpuAllocator allocator;
        kernels::cpu::CpuBackend backend(allocator);
        auto gpt = Model(kv_heads);
        CHILD_CHECK(gpt != nullptr, 2);
        auto shard = Shard(*gpt, tp, pp, coords, backend);
        CHILD_CHECK(shard.ok(), 3);
        CHILD_CHECK((*shard)->bytes() < static_cast<int64_t>(gpt->values().size()) * 4,
                    4);  // a part, not the whole
        const model::PagedCacheOptions cache{
            .num_blocks = 8, .block_size = 4, .max_tokens_per_step = 16, .max_seqs_per_step = 4};
        auto sharded =
            model::PagedGptForward::Create((*shard)->weights(), cache, backend, groups.tp);
        auto whole =
            model::PagedGptForward::Create(model::InferenceWeights::Of(*gpt), cache, backend);
        CHILD_CHECK(sharded.ok() && whole.ok(), 5);
        // Two sequences: a prompt chunk of 9 and one of 5, then a decode of each.
        const std::vector<int32_t> tables = {0, 1, 2, 7, 3, 4, 5, 6};
        const std::vector<std::vector<int32_t>> steps_tokens = {
            {1, 5, 9, 13, 17, 21, 25, 29, 33, 2, 4, 8, 16, 32}, {40, 0}};
        const std::vector<std::vector<int32_t>> steps_pos = {
            {0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4}, {9, 5}};
        const std::vector<std::vector<int32_t>> steps_seq = {
            {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, {0, 1}};
        const std::vector<std::vector<int32_t>> steps_rows = {{8, 13}, {0, 1}};
        const int Vs = (*shard)->weights().vocab_end - (*shard)->weights().vocab_begin;
        for (size_t k = 0; k < steps_tokens.size(); ++k) {
          const model::PagedStep step{.tokens = steps_tokens[k],
                                      .positions = steps_pos[k],
                                      .token_seq = steps_seq[k],
                                      .block_tables = tables,
                                      .num_seqs = 2,
                                      .max_blocks_per_seq = 4,
                                      .logit_rows = steps_rows[k]};
          // The residual from stage to stage, as the serving engine's ring moves it.
          const model::InferenceWeights& w = (*shard)->weights();
          const int N = static_cast<int>(steps_tokens[k].size());
          if (!w.first_stage()) {
            const std::span<float> input = (*sharded)->StageInput(N);
            CHILD_CHECK(input.size() == static_cast<size_t>(N) * Config().d_model, 13);
            CHILD_CHECK(groups.pp->Recv(input.data(), input.size(), DType::kFloat32, w.stage - 1)
                            .ok(),
                        14);
          }
          auto got = (*sharded)->Forward(step);
          CHILD_CHECK(got.ok(), 6);
          if (!w.last_stage()) {  // the residual after its layers, for the next stage
            CHILD_CHECK(got->size() == static_cast<size_t>(N) * Config().d_model, 15);
            CHILD_CHECK(groups.pp->Send(got->data(), got->size(), DType::kFloat32, w.stage + 1)
                            .ok(),
                        16);
            continue;
          }
          const std::vector<float> mine(got->begin(), got->end());
          auto want = (*whole)->Forward(step);
          CHILD_CHECK(want.ok(), 7);
          const int v0 = (*shard)->weights().vocab_begin;
          for (size_t r = 0; r < steps_rows[k].size(); ++r) {
            for (int v = 0; v < Vs; ++v) {
              const float a = mine[r * Vs + v], b = (*want)[r * Config().vocab + v0 + v];
              if (!(std::fabs(a - b) <= 1e-4f * (1.0f + std::fabs(b)))) {
                std::fprintf(stderr, "step %zu row %zu logit %d: tp %g, whole %g\n", k, r, v0 + v,
                             a, b);
                return 8;
              }
            }
          }
        }
        return 0;
      },
      std::chrono::seconds(60));
}

// What a request delivered.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  bool finished = false;
  absl::Status status;
  StreamCallbacks Callbacks() {
    return StreamCallbacks{.on_token =
                               [this](int32_t t) {
                                 std::lock_guard<std::mutex> lock(mu);
                                 tokens.push_back(t);
                               },
                           .on_finish =
                               [this](absl::Status s, FinishReason) {
                                 std::lock_guard<std::mutex> lock(mu);
                                 finished = true;
                                 status = std::move(s);
                                 cv.notify_all();
                               }};
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [this] { return finished; });
  }
};

TEST_P(ServingShardedTest, AnEngineOverTheGroupGivesTheSingleDeviceTokens) {
  // Not a structured binding: clang 14 (the sanitizer builds) cannot capture one in a lambda.
  const int tp = GetParam().tp, pp = GetParam().pp, kv_heads = GetParam().llama_kv_heads;
  RunWorld(
      tp, pp,
      [&](int, const placement::RankCoords& coords, const model::ShardedGroups& groups) {
        kernels::CpuAllocator allocator;
        kernels::cpu::CpuBackend backend(allocator);
        auto gpt = Model(kv_heads);
        CHILD_CHECK(gpt != nullptr, 2);
        auto shard = Shard(*gpt, tp, pp, coords, backend);
        CHILD_CHECK(shard.ok(), 3);
        const BatchingEngineOptions options{
            .max_running = 4, .max_tokens_per_step = 8, .block_size = 4};
        if (!IsLeader(groups)) {
          const absl::Status followed =
              RunServingFollower((*shard)->weights(), options, backend, GroupsOf(groups));
          if (!followed.ok()) std::fprintf(stderr, "follower: %s\n", followed.ToString().c_str());
          return followed.ok() ? 0 : 9;
        }
        auto engine =
            BatchingEngine::Create((*shard)->weights(), options, backend, GroupsOf(groups));
        CHILD_CHECK(engine.ok(), 4);
        std::mt19937 rng(3);
        std::vector<GenerationRequest> requests;
        for (int i = 0; i < 8; ++i) {
          GenerationRequest r;
          const int prompt_len = 1 + static_cast<int>(rng() % 14);
          for (int j = 0; j < prompt_len; ++j) r.prompt.push_back(int32_t(rng() % 41));
          r.max_tokens = 1 + static_cast<int>(rng() % (32 - prompt_len));
          r.temperature = i % 3 == 0 ? 0.0f : 0.8f;
          r.top_k = i % 2 == 0 ? 0 : 5;
          r.top_p = i % 4 == 1 ? 0.7f : 1.0f;
          r.seed = 40 + i;
          requests.push_back(r);
        }
        // Half now, half after an idle spell longer than the heartbeat.
        std::vector<Outcome> outcomes(requests.size());
        for (size_t i = 0; i < requests.size(); ++i) {
          if (i == requests.size() / 2) {
            for (size_t j = 0; j < i; ++j) CHILD_CHECK(outcomes[j].Wait(), 5);
            std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          }
          CHILD_CHECK((*engine)->Submit(requests[i], outcomes[i].Callbacks()).ok(), 6);
        }
        for (size_t i = 0; i < requests.size(); ++i) {
          CHILD_CHECK(outcomes[i].Wait(), 7);
          CHILD_CHECK(outcomes[i].status.ok(), 8);
          model::GenerateOptions reference;
          reference.max_new_tokens = requests[i].max_tokens;
          reference.sampling = {.temperature = requests[i].temperature,
                                .top_k = requests[i].top_k,
                                .top_p = requests[i].top_p,
                                .seed = requests[i].seed};
          auto want = model::Generate(model::InferenceWeights::Of(*gpt), backend,
                                      requests[i].prompt, reference);
          CHILD_CHECK(want.ok(), 10);
          if (outcomes[i].tokens != *want) {
            std::fprintf(stderr, "request %zu: the group's tokens differ from Generate's\n", i);
            return 11;
          }
        }
        CHILD_CHECK((*engine)->Batching().max_batch > 1, 12);
        // With stages, as many steps in flight as stages: every stage computed at once.
        CHILD_CHECK((*engine)->Batching().max_in_flight == pp, 14);
        (*engine)->Shutdown();  // the followers return OK on the stop message
        return 0;
      },
      std::chrono::seconds(120));
}

// Serving on a GPU, the ranks of a tp 2 and a pp 2 group sharing the one GPU (their steps,
// residuals and sampling over host shared memory, the forward's all-reduces staged through it, as
// a serve job on CUDA devices runs): greedy requests give the CPU's Generate tokens. Skipped, with
// the reason, where no GPU can run (labelled unit: it runs wherever the suite does).
TEST(ServingOnOneGpuTest, TensorAndPipelineRanksSharingAGpuGiveTheCpusGreedyTokens) {
  const std::string reason = testing::GpuUnavailableFromAChild();
  if (!reason.empty()) GTEST_SKIP() << reason;
  for (const Cut cut : {Cut{2, 1}, Cut{1, 2}}) {
    SCOPED_TRACE(::testing::PrintToString(cut));
    const int tp = cut.tp, pp = cut.pp;
    RunWorld(
        tp, pp,
        [&](int, const placement::RankCoords& coords, const model::ShardedGroups& groups) {
          kernels::CpuAllocator allocator;
          kernels::cpu::CpuBackend cpu(allocator);
          auto gpu =
              kernels::CreateBackend(kernels::BackendOptions{.device = kernels::Device::kCuda});
          CHILD_CHECK(gpu.ok(), 2);
          auto gpt = Model();
          CHILD_CHECK(gpt != nullptr, 3);
          auto shard = Shard(*gpt, tp, pp, coords, **gpu);
          CHILD_CHECK(shard.ok(), 4);
          std::unique_ptr<comm::Communicator> staged;
          const ServingGroups serving = GroupsForBackend(GroupsOf(groups), **gpu, staged);
          const BatchingEngineOptions options{
              .max_running = 4, .max_tokens_per_step = 8, .block_size = 4};
          if (!IsLeader(groups)) {
            const absl::Status followed =
                RunServingFollower((*shard)->weights(), options, **gpu, serving);
            if (!followed.ok()) std::fprintf(stderr, "follower: %s\n", followed.ToString().c_str());
            return followed.ok() ? 0 : 9;
          }
          auto engine = BatchingEngine::Create((*shard)->weights(), options, **gpu, serving);
          CHILD_CHECK(engine.ok(), 5);
          std::mt19937 rng(9);
          std::vector<GenerationRequest> requests;
          for (int i = 0; i < 6; ++i) {
            GenerationRequest r;
            const int prompt_len = 1 + static_cast<int>(rng() % 14);
            for (int j = 0; j < prompt_len; ++j) r.prompt.push_back(int32_t(rng() % 41));
            r.max_tokens = 1 + static_cast<int>(rng() % (32 - prompt_len));
            requests.push_back(r);  // greedy: temperature 0
          }
          std::vector<Outcome> outcomes(requests.size());
          for (size_t i = 0; i < requests.size(); ++i) {
            CHILD_CHECK((*engine)->Submit(requests[i], outcomes[i].Callbacks()).ok(), 6);
          }
          for (size_t i = 0; i < requests.size(); ++i) {
            CHILD_CHECK(outcomes[i].Wait(), 7);
            CHILD_CHECK(outcomes[i].status.ok(), 8);
            model::GenerateOptions greedy;
            greedy.max_new_tokens = requests[i].max_tokens;
            auto want =
                model::Generate(model::InferenceWeights::Of(*gpt), cpu, requests[i].prompt, greedy);
            CHILD_CHECK(want.ok(), 10);
            if (outcomes[i].tokens != *want) {
              std::fprintf(stderr, "request %zu: the GPU group's tokens differ from the CPU's\n",
                           i);
              return 11;
            }
          }
          (*engine)->Shutdown();
          return 0;
        },
        std::chrono::seconds(120));
  }
}

TEST_P(ServingShardedTest, AFollowerWhoseLeaderDiesReturnsAnError) {
  // Not a structured binding: clang 14 (the sanitizer builds) cannot capture one in a lambda.
  const int tp = GetParam().tp, pp = GetParam().pp;
  RunWorld(
      tp, pp,
      [&](int, const placement::RankCoords& coords, const model::ShardedGroups& groups) {
        kernels::CpuAllocator allocator;
        kernels::cpu::CpuBackend backend(allocator);
        auto gpt = Model();
        CHILD_CHECK(gpt != nullptr, 2);
        auto shard = Shard(*gpt, tp, pp, coords, backend);
        CHILD_CHECK(shard.ok(), 3);
        const BatchingEngineOptions options{.max_running = 2, .max_tokens_per_step = 8};
        if (!IsLeader(groups)) {
          const absl::Status followed =
              RunServingFollower((*shard)->weights(), options, backend, GroupsOf(groups));
          std::fprintf(stderr, "follower after its leader died: %s\n", followed.ToString().c_str());
          return followed.ok() ? 9 : 0;  // an error is what it must give
        }
        auto engine =
            BatchingEngine::Create((*shard)->weights(), options, backend, GroupsOf(groups));
        CHILD_CHECK(engine.ok(), 4);
        Outcome out;
        CHILD_CHECK(
            (*engine)
                ->Submit(GenerationRequest{.prompt = {1, 2, 3}, .max_tokens = 4}, out.Callbacks())
                .ok(),
            5);
        CHILD_CHECK(out.Wait() && out.status.ok(), 6);
        std::_Exit(0);  // dies without the stop message
      },
      std::chrono::seconds(120));
}

// Two stages turn the ring: a step with its residual and the tokens coming back arrive whole, and
// a malformed header (raw, from a peer that does not follow the protocol) is refused naming what
// is wrong, before any body is read.
TEST(StepMessageTest, TheRingPassesSlotsWholeAndRefusesMalformedHeaders) {
  RunWorld(
      1, 2,
      [&](int, const placement::RankCoords&, const model::ShardedGroups& groups) {
        comm::Communicator& ring = *groups.pp;
        const SlotLimits limits{.max_payload_ints = 16, .max_residual_floats = 8};
        const int stage = ring.rank();
        // A step from stage 0, tokens from stage 1: each gets the other's.
        Slot out;
        if (stage == 0) {
          out = Slot{.kind = StepKind::kStep, .payload = {1, 2, 3}, .residual = {0.5f, -1.0f}};
        } else {
          out = Slot{.kind = StepKind::kTokens, .payload = {7, 8}};
        }
        auto in = TurnRing(ring, out, limits);
        CHILD_CHECK(in.ok(), 2);
        if (stage == 1) {
          CHILD_CHECK(in->kind == StepKind::kStep, 3);
          CHILD_CHECK((in->payload == std::vector<int32_t>{1, 2, 3}), 4);
          CHILD_CHECK((in->residual == std::vector<float>{0.5f, -1.0f}), 5);
        } else {
          CHILD_CHECK(in->kind == StepKind::kTokens, 6);
          CHILD_CHECK((in->payload == std::vector<int32_t>{7, 8}), 7);
          CHILD_CHECK(in->residual.empty(), 8);
        }
        // Stage 0 now sends raw headers that stage 1 must refuse.
        const std::vector<std::pair<std::vector<int32_t>, std::string>> bad = {
            {{9, 1, 0}, "no such kind"},
            {{2, 1, 0}, "an idle or stop message carries nothing"},
            {{1, 17, 0}, "the payload must be 1..16"},
            {{1, 4, 9}, "the residual must be 0..8"},
            {{4, 2, 1}, "(0 with tokens)"},
        };
        for (const auto& [header, why] : bad) {
          if (stage == 0) {
            int32_t mine[kHeaderInts] = {0, 0, 0}, theirs[kHeaderInts];
            std::copy(header.begin(), header.end(), mine);
            CHILD_CHECK(ring.SendRecv(mine, kHeaderInts, 1, theirs, kHeaderInts, 1, DType::kInt32)
                            .ok(),
                        9);
          } else {
            auto refused = TurnRing(ring, Slot{.kind = StepKind::kIdle}, limits);
            CHILD_CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument, 10);
            const std::string message(refused.status().message());
            if (message.find(why) == std::string::npos ||
                message.find("from stage 0") == std::string::npos) {
              std::fprintf(stderr, "refusal '%s' lacks '%s'\n", message.c_str(), why.c_str());
              return 11;
            }
          }
        }
        return 0;
      },
      std::chrono::seconds(60));
}

TEST(StepMessageTest, RoundTripsAndRefusesWhatDoesNotAddUp) {
  const std::vector<int32_t> tokens = {3, 4, 5}, positions = {0, 1, 7}, seq = {0, 0, 1};
  const std::vector<int32_t> tables = {2, 0, 1, 3}, rows = {1, 2};
  const std::vector<model::RowSampling> sampling = {
      {.options = {.temperature = 0.75f, .top_k = 3, .top_p = 0.5f, .seed = 0x123456789abcdefULL},
       .draw = 9},
      {.options = {.temperature = 0.0f, .top_k = 0, .seed = 1}, .draw = uint64_t{1} << 40}};
  const model::PagedStep step{.tokens = tokens,
                              .positions = positions,
                              .token_seq = seq,
                              .block_tables = tables,
                              .num_seqs = 2,
                              .max_blocks_per_seq = 2,
                              .logit_rows = rows};
  const model::PagedCacheOptions limits{
      .num_blocks = 4, .block_size = 4, .max_tokens_per_step = 8, .max_seqs_per_step = 2};
  const std::vector<int32_t> payload = EncodeStep(step, sampling);
  auto decoded = DecodeStep(payload, limits);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->tokens, tokens);
  EXPECT_EQ(decoded->positions, positions);
  EXPECT_EQ(decoded->token_seq, seq);
  EXPECT_EQ(decoded->block_tables, tables);
  EXPECT_EQ(decoded->logit_rows, rows);
  EXPECT_EQ(decoded->num_seqs, 2);
  EXPECT_EQ(decoded->max_blocks_per_seq, 2);
  ASSERT_EQ(decoded->sampling.size(), 2u);
  EXPECT_EQ(decoded->sampling[0].options.temperature, 0.75f);
  EXPECT_EQ(decoded->sampling[0].options.top_k, 3);
  EXPECT_EQ(decoded->sampling[0].options.top_p, 0.5f);
  EXPECT_EQ(decoded->sampling[0].options.seed, 0x123456789abcdefULL);
  EXPECT_EQ(decoded->sampling[1].draw, uint64_t{1} << 40);

  auto refused = [&](std::vector<int32_t> bad, const std::string& needle) {
    auto result = DecodeStep(bad, limits);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(std::string(result.status().message()).find(needle), std::string::npos)
        << result.status();
  };
  refused({1, 2}, "fewer than its 4 counts");
  refused(std::vector<int32_t>(payload.begin(), payload.end() - 1), "where its counts make");
  std::vector<int32_t> bad = payload;
  bad[0] = 9;  // more tokens than a step holds
  refused(bad, "9 tokens, outside 1..8");
  bad = payload;
  bad[1] = 3;
  refused(bad, "3 sequences, outside 1..2");
  bad = payload;
  bad[2] = 5;
  refused(bad, "5 blocks per sequence");
  bad = payload;
  bad[3] = 3;
  refused(bad, "3 logit rows for 2 sequences");
  bad = payload;
  bad[payload.size() - 13] = -1;  // the first row's top_k
  refused(bad, "top_k -1");
  bad = payload;
  bad[payload.size() - 12] = 0;  // the first row's top_p: 0.0f
  refused(bad, "top_p 0");
}

INSTANTIATE_TEST_SUITE_P(Tp, ServingSamplingTest, ::testing::Values(2, 3),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });
INSTANTIATE_TEST_SUITE_P(Cuts, ServingShardedTest,
                         // Llama: 2 key/value heads cut over tp 2, and one shared by 3 ranks.
                         ::testing::Values(Cut{2, 1}, Cut{3, 1}, Cut{1, 2}, Cut{2, 2}, Cut{2, 1, 2},
                                           Cut{2, 2, 2}, Cut{3, 1, 1}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) + "pp" +
                                  std::to_string(info.param.pp) +
                                  (info.param.llama_kv_heads > 0
                                       ? "_llama_kv" + std::to_string(info.param.llama_kv_heads)
                                       : "");
                         });

}  // namespace
}  // namespace shardline::serving
