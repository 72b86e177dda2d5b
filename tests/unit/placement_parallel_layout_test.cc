#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "placement/parallel_layout.h"

namespace shardline::placement {
namespace {

using ::testing::ElementsAre;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

// The groups' ranks, for compact expectations.
std::vector<std::vector<int>> RanksOf(const std::vector<CommGroup>& groups) {
  std::vector<std::vector<int>> ranks;
  for (const CommGroup& group : groups) ranks.push_back(group.ranks);
  return ranks;
}

std::vector<std::string> IdsOf(const std::vector<CommGroup>& groups) {
  std::vector<std::string> ids;
  for (const CommGroup& group : groups) ids.push_back(group.id);
  return ids;
}

std::vector<std::pair<int, int>> Ranges(const std::vector<StageRange>& stages) {
  std::vector<std::pair<int, int>> out;
  for (const StageRange& stage : stages) out.emplace_back(stage.first, stage.last);
  return out;
}

TEST(RankGridTest, CreateRejectsBadDegrees) {
  EXPECT_FALSE(RankGrid::Create(0, 1, 1).ok());
  EXPECT_FALSE(RankGrid::Create(1, -1, 1).ok());
  absl::StatusOr<RankGrid> zero_dp = RankGrid::Create(1, 1, 0);
  ASSERT_FALSE(zero_dp.ok());
  EXPECT_EQ(zero_dp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(zero_dp.status()), "dp must be at least 1, got 0");
  absl::StatusOr<RankGrid> huge = RankGrid::Create(65536, 65536, 2);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(Message(huge.status()),
            "tp·pp·dp = 65536·65536·2 = 8589934592 ranks do not fit in an int");
}

TEST(RankGridTest, CoordsAndRankRoundTripForEveryShape) {
  for (int tp = 1; tp <= 3; ++tp) {
    for (int pp = 1; pp <= 3; ++pp) {
      for (int dp = 1; dp <= 3; ++dp) {
        SCOPED_TRACE(testing::Message() << "tp=" << tp << " pp=" << pp << " dp=" << dp);
        absl::StatusOr<RankGrid> grid = RankGrid::Create(tp, pp, dp);
        ASSERT_TRUE(grid.ok()) << grid.status();
        EXPECT_EQ(grid->world(), tp * pp * dp);
        std::set<std::tuple<int, int, int>> seen;
        for (int rank = 0; rank < grid->world(); ++rank) {
          const RankCoords c = grid->Coords(rank);
          EXPECT_GE(c.tp, 0);
          EXPECT_LT(c.tp, tp);
          EXPECT_GE(c.dp, 0);
          EXPECT_LT(c.dp, dp);
          EXPECT_GE(c.pp, 0);
          EXPECT_LT(c.pp, pp);
          EXPECT_EQ(grid->Rank(c), rank);
          // The DESIGN formula, written out independently of RankGrid::Rank.
          EXPECT_EQ(rank, c.tp + tp * (c.dp + dp * c.pp));
          seen.insert({c.tp, c.dp, c.pp});
        }
        EXPECT_EQ(seen.size(), static_cast<size_t>(tp * pp * dp));
      }
    }
  }
}

TEST(RankGridTest, DesignWorkedExample) {
  // tp=2, dp=2, pp=2: rank 5 = 1 + 2·(0 + 2·1).
  absl::StatusOr<RankGrid> grid = RankGrid::Create(/*tp=*/2, /*pp=*/2, /*dp=*/2);
  ASSERT_TRUE(grid.ok()) << grid.status();
  const RankCoords c = grid->Coords(5);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(grid->Rank({.tp = 1, .dp = 0, .pp = 1}), 5);

  const std::vector<CommGroup> groups = grid->GroupsOf(5);
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].kind, "world");
  EXPECT_EQ(groups[0].id, "world");
  EXPECT_THAT(groups[0].ranks, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(groups[1].kind, "tp");
  EXPECT_EQ(groups[1].id, "tp-d0-p1");
  EXPECT_THAT(groups[1].ranks, ElementsAre(4, 5));  // contiguous
  EXPECT_EQ(groups[2].kind, "pp");
  EXPECT_EQ(groups[2].id, "pp-t1-d0");
  EXPECT_THAT(groups[2].ranks, ElementsAre(1, 5));  // strides by tp·dp, stage order
  EXPECT_EQ(groups[3].kind, "dp");
  EXPECT_EQ(groups[3].id, "dp-t1-p1");
  EXPECT_THAT(groups[3].ranks, ElementsAre(5, 7));  // strides by tp
}

TEST(RankGridTest, AllGroupsInOrder) {
  absl::StatusOr<RankGrid> grid = RankGrid::Create(/*tp=*/2, /*pp=*/2, /*dp=*/2);
  ASSERT_TRUE(grid.ok()) << grid.status();
  const std::vector<CommGroup> groups = grid->AllGroups();
  EXPECT_THAT(IdsOf(groups), ElementsAre("world", "tp-d0-p0", "tp-d1-p0", "tp-d0-p1", "tp-d1-p1",
                                         "pp-t0-d0", "pp-t1-d0", "pp-t0-d1", "pp-t1-d1", "dp-t0-p0",
                                         "dp-t1-p0", "dp-t0-p1", "dp-t1-p1"));
  EXPECT_THAT(RanksOf(groups), ElementsAre(ElementsAre(0, 1, 2, 3, 4, 5, 6, 7), ElementsAre(0, 1),
                                           ElementsAre(2, 3), ElementsAre(4, 5), ElementsAre(6, 7),
                                           ElementsAre(0, 4), ElementsAre(1, 5), ElementsAre(2, 6),
                                           ElementsAre(3, 7), ElementsAre(0, 2), ElementsAre(1, 3),
                                           ElementsAre(4, 6), ElementsAre(5, 7)));
}

TEST(RankGridTest, GroupsPartitionTheWorldForEveryShape) {
  for (int tp = 1; tp <= 3; ++tp) {
    for (int pp = 1; pp <= 3; ++pp) {
      for (int dp = 1; dp <= 3; ++dp) {
        SCOPED_TRACE(testing::Message() << "tp=" << tp << " pp=" << pp << " dp=" << dp);
        absl::StatusOr<RankGrid> grid = RankGrid::Create(tp, pp, dp);
        ASSERT_TRUE(grid.ok()) << grid.status();
        const int world = grid->world();
        const std::vector<CommGroup> all = grid->AllGroups();
        // Per kind: how many groups, their size, and in how many groups each rank appears.
        const std::map<std::string, std::pair<int, int>> expected = {{"world", {1, world}},
                                                                     {"tp", {pp * dp, tp}},
                                                                     {"pp", {tp * dp, pp}},
                                                                     {"dp", {tp * pp, dp}}};
        std::map<std::string, int> count;
        std::map<std::string, std::vector<int>> membership;
        std::set<std::string> ids;
        std::string previous_kind;
        int previous_first = -1;
        const std::vector<std::string> kind_order = {"world", "tp", "pp", "dp"};
        for (const CommGroup& group : all) {
          EXPECT_TRUE(ids.insert(group.id).second) << "duplicate id " << group.id;
          ASSERT_TRUE(expected.count(group.kind)) << group.kind;
          EXPECT_EQ(static_cast<int>(group.ranks.size()), expected.at(group.kind).second)
              << group.id;
          // Kinds in order world, tp, pp, dp; within a kind, by lowest rank.
          if (group.kind == previous_kind) {
            EXPECT_GT(group.ranks.front(), previous_first) << group.id;
          } else if (!previous_kind.empty()) {
            const auto prev = std::find(kind_order.begin(), kind_order.end(), previous_kind);
            const auto here = std::find(kind_order.begin(), kind_order.end(), group.kind);
            EXPECT_EQ(here, prev + 1) << group.id;
          }
          previous_kind = group.kind;
          previous_first = group.ranks.front();
          ++count[group.kind];
          std::vector<int>& seen = membership[group.kind];
          seen.resize(world, 0);
          for (const int rank : group.ranks) {
            ASSERT_GE(rank, 0);
            ASSERT_LT(rank, world);
            ++seen[rank];
          }
        }
        for (const auto& [kind, shape] : expected) {
          EXPECT_EQ(count[kind], shape.first) << kind;
          EXPECT_THAT(membership[kind], ::testing::Each(1)) << kind;
        }
        // GroupsOf(rank) lists exactly the groups of AllGroups that hold rank, at its group rank.
        for (int rank = 0; rank < world; ++rank) {
          const std::vector<CommGroup> mine = grid->GroupsOf(rank);
          ASSERT_EQ(mine.size(), 4u);
          for (size_t k = 0; k < mine.size(); ++k) {
            EXPECT_EQ(mine[k].kind, kind_order[k]);
            const auto it = std::find_if(all.begin(), all.end(),
                                         [&](const CommGroup& g) { return g.id == mine[k].id; });
            ASSERT_NE(it, all.end()) << mine[k].id;
            EXPECT_EQ(it->ranks, mine[k].ranks) << mine[k].id;
            EXPECT_THAT(mine[k].ranks, ::testing::Contains(rank)) << mine[k].id;
          }
          // The group ranks are the coordinates: tp group rank = tp index, and so on.
          const RankCoords c = grid->Coords(rank);
          EXPECT_EQ(mine[1].ranks[c.tp], rank);
          EXPECT_EQ(mine[2].ranks[c.pp], rank);
          EXPECT_EQ(mine[3].ranks[c.dp], rank);
        }
      }
    }
  }
}

TEST(StagesTest, BalancedStagesEvenAndUneven) {
  EXPECT_THAT(Ranges(BalancedStages(4, 1)), ElementsAre(std::pair(0, 4)));
  EXPECT_THAT(Ranges(BalancedStages(4, 2)), ElementsAre(std::pair(0, 2), std::pair(2, 4)));
  EXPECT_THAT(Ranges(BalancedStages(4, 4)),
              ElementsAre(std::pair(0, 1), std::pair(1, 2), std::pair(2, 3), std::pair(3, 4)));
  // No middle stage: the extra layer goes to the first stage, not the head's.
  EXPECT_THAT(Ranges(BalancedStages(5, 2)), ElementsAre(std::pair(0, 3), std::pair(3, 5)));
  // Middle stages first, from stage 1 on.
  EXPECT_THAT(Ranges(BalancedStages(7, 3)),
              ElementsAre(std::pair(0, 2), std::pair(2, 5), std::pair(5, 7)));
  EXPECT_THAT(Ranges(BalancedStages(5, 4)),
              ElementsAre(std::pair(0, 1), std::pair(1, 3), std::pair(3, 4), std::pair(4, 5)));
  EXPECT_THAT(Ranges(BalancedStages(6, 4)),
              ElementsAre(std::pair(0, 1), std::pair(1, 3), std::pair(3, 5), std::pair(5, 6)));
  // Every middle stage has one more, and one is left for the first stage.
  EXPECT_THAT(Ranges(BalancedStages(7, 4)),
              ElementsAre(std::pair(0, 2), std::pair(2, 4), std::pair(4, 6), std::pair(6, 7)));
  EXPECT_THAT(Ranges(BalancedStages(8, 3)),
              ElementsAre(std::pair(0, 3), std::pair(3, 6), std::pair(6, 8)));
}

TEST(StagesTest, BalancedStagesCoverAllLayersWithinOne) {
  for (int layers = 1; layers <= 12; ++layers) {
    for (int pp = 1; pp <= layers; ++pp) {
      const std::vector<StageRange> stages = BalancedStages(layers, pp);
      ASSERT_EQ(static_cast<int>(stages.size()), pp);
      int next = 0, smallest = layers, largest = 0;
      for (const StageRange& stage : stages) {
        EXPECT_EQ(stage.first, next);
        EXPECT_GE(stage.size(), 1);
        smallest = std::min(smallest, stage.size());
        largest = std::max(largest, stage.size());
        next = stage.last;
      }
      EXPECT_EQ(next, layers);
      EXPECT_LE(largest - smallest, 1) << layers << " on " << pp;
      // The last stage (head and loss) never gets an extra layer.
      EXPECT_EQ(stages.back().size(), layers / pp) << layers << " on " << pp;
    }
  }
}

TEST(StagesTest, StagesOfUsesOrChecksTheList) {
  ParallelSpec spec;
  spec.pp = 2;
  absl::StatusOr<std::vector<StageRange>> balanced = StagesOf(spec, 5);
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  EXPECT_THAT(Ranges(*balanced), ElementsAre(std::pair(0, 3), std::pair(3, 5)));

  spec.stage_layers = {1, 4};
  absl::StatusOr<std::vector<StageRange>> listed = StagesOf(spec, 5);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(Ranges(*listed), ElementsAre(std::pair(0, 1), std::pair(1, 5)));

  EXPECT_EQ(Message(StagesOf(spec, 4).status()),
            "stages add up to 5 layers but the model has 4: 1 too many");
  EXPECT_EQ(Message(StagesOf(spec, 7).status()),
            "stages add up to 5 layers but the model has 7: 2 too few");
  spec.stage_layers = {2, 0};
  EXPECT_EQ(Message(StagesOf(spec, 2).status()),
            "stages[1] is 0: every pipeline stage needs at least 1 layer");
  spec.stage_layers = {1, 1, 2};
  EXPECT_EQ(Message(StagesOf(spec, 4).status()), "stages lists 3 stages but pp is 2: 1 too many");
  spec.stage_layers.clear();
  spec.pp = 6;
  EXPECT_EQ(Message(StagesOf(spec, 4).status()),
            "pp 6 is more than the model's 4 layers: 2 pipeline stages would have no layer");
}

// A model every rule below changes in one place: 4 layers, 4 heads, d_ff 256, vocab 257.
model::ModelConfig SmallModel() {
  model::ModelConfig model;
  model.layers = 4;
  model.heads = 4;
  model.d_model = 64;
  model.d_ff = 256;
  model.vocab = 257;
  model.max_seq_len = 64;
  return model;
}

ParallelSpec Layout(int tp, int pp, int dp) {
  ParallelSpec spec;
  spec.tp = tp;
  spec.pp = pp;
  spec.dp = dp;
  return spec;
}

std::string ErrorOf(const model::ModelConfig& model, int64_t batch, const ParallelSpec& spec,
                    int devices) {
  const absl::Status status = ValidateParallel(model, batch, spec, devices);
  EXPECT_FALSE(status.ok()) << "validated unexpectedly";
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return Message(status);
}

TEST(ValidateParallelTest, GoodLayoutsPass) {
  const model::ModelConfig model = SmallModel();
  EXPECT_TRUE(ValidateParallel(model, 8, Layout(1, 1, 1), 1).ok());
  EXPECT_TRUE(ValidateParallel(model, 8, Layout(2, 2, 1), 4).ok());
  EXPECT_TRUE(ValidateParallel(model, 8, Layout(4, 4, 2), 32).ok());
  ParallelSpec micro = Layout(2, 2, 2);
  micro.micro_batch = 2;
  micro.zero = 3;
  EXPECT_TRUE(ValidateParallel(model, 8, micro, 8).ok());
  // ZeRO over a data-parallel group of one changes nothing, but is not wrong.
  ParallelSpec zero_alone = Layout(1, 1, 1);
  zero_alone.zero = 2;
  EXPECT_TRUE(ValidateParallel(model, 8, zero_alone, 1).ok());
  // The vocabulary may split unevenly: 257 rows over 2 ranks.
  EXPECT_TRUE(ValidateParallel(model, 8, Layout(2, 1, 1), 2).ok());
  // d_ff 0 means 4·d_model = 256.
  model::ModelConfig default_ff = model;
  default_ff.d_ff = 0;
  EXPECT_TRUE(ValidateParallel(default_ff, 8, Layout(4, 1, 1), 4).ok());
}

TEST(ValidateParallelTest, EveryRuleSaysWhichAndByHowMuch) {
  const model::ModelConfig model = SmallModel();
  EXPECT_EQ(ErrorOf(model, 8, Layout(0, 1, 1), 1), "tp must be at least 1, got 0");
  EXPECT_EQ(ErrorOf(model, 8, Layout(1, 0, 1), 1), "pp must be at least 1, got 0");
  EXPECT_EQ(ErrorOf(model, 8, Layout(1, 1, -2), 1), "dp must be at least 1, got -2");

  ParallelSpec zero = Layout(1, 1, 1);
  zero.zero = 4;
  EXPECT_EQ(ErrorOf(model, 8, zero, 1), "zero must be 0, 1, 2 or 3 (the ZeRO stage), got 4");

  EXPECT_EQ(ErrorOf(model, 8, Layout(8, 1, 1), 8),
            "tp 8 is more than heads 4: 4 tensor-parallel ranks would have no attention head");
  model::ModelConfig six_heads = model;
  six_heads.heads = 6;
  six_heads.d_model = 96;
  EXPECT_EQ(ErrorOf(six_heads, 8, Layout(4, 1, 1), 4),
            "heads 6 is not divisible by tp 4: "
            "remainder 2");

  model::ModelConfig odd_ff = model;
  odd_ff.d_ff = 250;
  EXPECT_EQ(ErrorOf(odd_ff, 8, Layout(4, 1, 1), 4),
            "d_ff 250 is not divisible by tp 4: "
            "remainder 2");
  model::ModelConfig tiny_ff = model;
  tiny_ff.heads = 8;
  tiny_ff.d_ff = 4;
  EXPECT_EQ(ErrorOf(tiny_ff, 8, Layout(8, 1, 1), 8),
            "tp 8 is more than d_ff 4: 4 tensor-parallel ranks would have no MLP column");

  model::ModelConfig many_heads = model;
  many_heads.heads = 512;
  many_heads.d_model = 512;
  many_heads.d_ff = 2048;
  EXPECT_EQ(ErrorOf(many_heads, 512, Layout(512, 1, 1), 512),
            "tp 512 is more than vocab 257: 255 tensor-parallel ranks would have no vocabulary "
            "row");

  EXPECT_EQ(ErrorOf(model, 8, Layout(1, 8, 1), 8),
            "pp 8 is more than the model's 4 layers: 4 pipeline stages would have no layer");
  ParallelSpec stages = Layout(1, 2, 1);
  stages.stage_layers = {3, 3};
  EXPECT_EQ(ErrorOf(model, 8, stages, 2),
            "stages add up to 6 layers but the model has 4: 2 too many");

  EXPECT_EQ(ErrorOf(model, 8, Layout(2, 2, 2), 4),
            "tp·pp·dp = 2·2·2 = 8 but the job has 4 actors: 4 too many");
  EXPECT_EQ(ErrorOf(model, 8, Layout(2, 1, 1), 5),
            "tp·pp·dp = 2·1·1 = 2 but the job has 5 actors: 3 too few");

  EXPECT_EQ(ErrorOf(model, 0, Layout(1, 1, 1), 1), "batch must be at least 1, got 0");
  EXPECT_EQ(ErrorOf(model, 3, Layout(1, 1, 4), 4),
            "batch 3 is smaller than dp 4: 1 data-parallel ranks would have no sequence");
  EXPECT_EQ(ErrorOf(model, 10, Layout(1, 1, 4), 4),
            "batch 10 is not divisible by dp 4: remainder 2");

  ParallelSpec micro = Layout(1, 1, 4);
  micro.micro_batch = 2;
  EXPECT_EQ(ErrorOf(model, 10, micro, 4),
            "batch 10 is not divisible by micro_batch·dp = 2·4 = 8: remainder 2");
  micro.micro_batch = 8;
  EXPECT_EQ(ErrorOf(model, 16, micro, 4),
            "micro_batch 8 is more than batch/dp = 16/4 = 4, the sequences one data-parallel "
            "rank trains per step");
  micro.micro_batch = 3;
  EXPECT_EQ(ErrorOf(model, 10, micro, 4),
            "micro_batch 3 is more than batch/dp = 10/4 = 2.5, the sequences one data-parallel "
            "rank trains per step");
  micro.micro_batch = -1;
  EXPECT_EQ(ErrorOf(model, 16, micro, 4), "micro_batch must be at least 1, got -1");
  micro.micro_batch = 3;
  EXPECT_EQ(ErrorOf(model, 16, micro, 4),
            "batch 16 is not divisible by micro_batch·dp = 3·4 = 12: remainder 4");
}

TEST(MicroBatchTest, SizeCountAndFirstSample) {
  ParallelSpec spec = Layout(1, 2, 2);
  // Default: one micro-batch of batch/dp.
  EXPECT_EQ(MicroBatchSize(spec, 8), 4);
  EXPECT_EQ(MicroBatchCount(spec, 8), 1);
  EXPECT_EQ(FirstSample(spec, 8, 0, 0), 0);
  EXPECT_EQ(FirstSample(spec, 8, 1, 0), 4);

  // dp=2, two micro-batches of 2: rank 0 trains rows 0-1 then 2-3, rank 1 rows 4-5 then 6-7.
  spec.micro_batch = 2;
  ASSERT_TRUE(ValidateParallel(SmallModel(), 8, spec, 4).ok());
  EXPECT_EQ(MicroBatchSize(spec, 8), 2);
  EXPECT_EQ(MicroBatchCount(spec, 8), 2);
  EXPECT_EQ(FirstSample(spec, 8, 0, 0), 0);
  EXPECT_EQ(FirstSample(spec, 8, 0, 1), 2);
  EXPECT_EQ(FirstSample(spec, 8, 1, 0), 4);
  EXPECT_EQ(FirstSample(spec, 8, 1, 1), 6);

  // Every row of the global batch is trained exactly once, in order per rank.
  spec.micro_batch = 3;
  const int64_t batch = 12;
  ASSERT_TRUE(ValidateParallel(SmallModel(), batch, spec, 4).ok());
  std::vector<int> seen(batch, 0);
  for (int d = 0; d < spec.dp; ++d) {
    for (int64_t m = 0; m < MicroBatchCount(spec, batch); ++m) {
      for (int64_t row = 0; row < MicroBatchSize(spec, batch); ++row) {
        ++seen[FirstSample(spec, batch, d, m) + row];
      }
    }
  }
  EXPECT_THAT(seen, ::testing::Each(1));
}

}  // namespace
}  // namespace shardline::placement
