// Pipeline schedules as action lists (placement/pipeline_schedule.h), checked without any
// communicator: the 1F1B lists are the ones the engine ran inline before it executed lists, every
// schedule built passes the rendezvous analysis, and the analysis itself catches lists that
// would deadlock or run a pass out of order.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/pipeline_schedule.h"

namespace shardline::placement {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Strings(const std::vector<PipeAction>& actions) {
  std::vector<std::string> out;
  for (const PipeAction& a : actions) out.push_back(DebugString(a));
  return out;
}

int Count(const std::vector<PipeAction>& actions, PipeOp op) {
  int n = 0;
  for (const PipeAction& a : actions) n += a.op == op;
  return n;
}

TEST(PipelineScheduleTest, OneFOneBIsTheInlineScheduleItReplaced) {
  auto schedule = PipelineSchedule::Create(PipelineScheduleKind::k1F1B, 2, 1, 3);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_THAT(
      Strings(schedule->Actions(0)),
      ElementsAre("F0.0", "S[act 0.0 ->1]", "F1.0", "SR[act 1.0 ->1 | grad 0.0 <-1]", "B0.0",
                  "F2.0", "SR[act 2.0 ->1 | grad 1.0 <-1]", "B1.0", "R[grad 2.0 <-1]", "B2.0"));
  EXPECT_THAT(
      Strings(schedule->Actions(1)),
      ElementsAre("R[act 0.0 <-0]", "F0.0", "B0.0", "SR[grad 0.0 ->0 | act 1.0 <-0]", "F1.0",
                  "B1.0", "SR[grad 1.0 ->0 | act 2.0 <-0]", "F2.0", "B2.0", "S[grad 2.0 ->0]"));
}

TEST(PipelineScheduleTest, OneFOneBKeepsMinOfStagesLeftAndMicroBatchesInFlight) {
  for (int P = 1; P <= 5; ++P) {
    for (int m = 1; m <= 9; ++m) {
      auto schedule = PipelineSchedule::Create(PipelineScheduleKind::k1F1B, P, 1, m);
      ASSERT_TRUE(schedule.ok()) << "P=" << P << " m=" << m << ": " << schedule.status();
      for (int s = 0; s < P; ++s) {
        EXPECT_EQ(schedule->MaxInFlight(s, 0), std::min(P - s, m)) << "P=" << P << " m=" << m;
        // Each input arrives right before its forward.
        EXPECT_EQ(schedule->MaxInputs(s, 0), schedule->MaxInFlight(s, 0));
        EXPECT_EQ(schedule->MaxInFlightWithoutHead(s), s == P - 1 ? 0 : std::min(P - s, m));
        EXPECT_EQ(schedule->MaxEarlyGradients(s), 0);
        for (const PipeAction& a : schedule->Actions(s)) EXPECT_FALSE(a.held) << DebugString(a);
        EXPECT_EQ(Count(schedule->Actions(s), PipeOp::kForward), m);
        EXPECT_EQ(Count(schedule->Actions(s), PipeOp::kBackward), m);
      }
      // Equal stages: the bubble is (P − 1)/(m + P − 1) of the step.
      EXPECT_NEAR(schedule->SimulatedBubble(), double(P - 1) / (m + P - 1), 1e-9)
          << "P=" << P << " m=" << m;
      EXPECT_NEAR(schedule->SimulatedLength(), 3.0 * (m + P - 1), 1e-9);
    }
  }
}

TEST(PipelineScheduleTest, InterleavedRunsMegatronsOrderOfChunks) {
  auto schedule = PipelineSchedule::Create(PipelineScheduleKind::kInterleaved, 2, 2, 4);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  std::vector<std::string> forwards, backwards;
  for (const PipeAction& a : schedule->Actions(0)) {
    if (a.op == PipeOp::kForward) forwards.push_back(DebugString(a));
    if (a.op == PipeOp::kBackward) backwards.push_back(DebugString(a));
  }
  // Groups of pp micro-batches go through chunk 0, then chunk 1; backwards visit the chunks in
  // reverse.
  EXPECT_THAT(forwards,
              ElementsAre("F0.0", "F1.0", "F0.1", "F1.1", "F2.0", "F3.0", "F2.1", "F3.1"));
  EXPECT_THAT(backwards,
              ElementsAre("B0.1", "B1.1", "B0.0", "B1.0", "B2.1", "B3.1", "B2.0", "B3.0"));
  // The last stage's chunk 0 feeds the first stage's chunk 1.
  bool sends_across = false;
  for (const PipeAction& a : schedule->Actions(1)) {
    if ((a.op == PipeOp::kSend || a.op == PipeOp::kSendRecv) &&
        a.send.payload == PipePayload::kActivation) {
      EXPECT_EQ(a.send.chunk, 0) << DebugString(a);
      EXPECT_EQ(a.send.peer, 0) << DebugString(a);
      sends_across = true;
    }
  }
  EXPECT_TRUE(sends_across);
}

TEST(PipelineScheduleTest, InterleavedIsCheckedAndHasLessBubbleThanOneFOneB) {
  for (int P : {2, 3, 4}) {
    for (int V : {2, 3, 4}) {
      for (int m = P; m <= 4 * P; m += P) {
        auto interleaved = PipelineSchedule::Create(PipelineScheduleKind::kInterleaved, P, V, m);
        ASSERT_TRUE(interleaved.ok())
            << "P=" << P << " V=" << V << " m=" << m << ": " << interleaved.status();
        auto plain = PipelineSchedule::Create(PipelineScheduleKind::k1F1B, P, 1, m);
        ASSERT_TRUE(plain.ok());
        EXPECT_LT(interleaved->SimulatedBubble(), plain->SimulatedBubble())
            << "P=" << P << " V=" << V << " m=" << m;
        for (int s = 0; s < P; ++s) {
          EXPECT_EQ(Count(interleaved->Actions(s), PipeOp::kForward), m * V);
          // A stage holds gradients apart exactly when one of its receives is marked so.
          int held = 0;
          for (const PipeAction& a : interleaved->Actions(s)) held += a.held;
          EXPECT_EQ(held > 0, interleaved->MaxEarlyGradients(s) > 0)
              << "P=" << P << " V=" << V << " m=" << m << " stage " << s;
          EXPECT_LE(interleaved->MaxEarlyGradients(s), held);
          EXPECT_EQ(Count(interleaved->Actions(s), PipeOp::kBackward), m * V);
          const int together = interleaved->MaxInFlightWithoutHead(s) +
                               (s == P - 1 ? interleaved->MaxInFlight(s, V - 1) : 0);
          for (int c = 0; c < V; ++c) {
            EXPECT_GE(interleaved->MaxInFlight(s, c), 1);
            EXPECT_LE(interleaved->MaxInFlight(s, c), m);
          }
          // Megatron's in-flight forwards: (P − s − 1)·2 + (V − 1)·P waiting plus the one
          // running (all m·V when m = P); the last stage's head has a pool of its own, one more.
          // Inputs may arrive earlier than their forward (a send does not wait for its receiver's
          // turn), and are counted apart.
          const int megatron =
              m == P ? m * V : std::min(m * V, (P - s - 1) * 2 + (V - 1) * P + 1);
          EXPECT_LE(together, megatron + (s == P - 1 ? 1 : 0))
              << "P=" << P << " V=" << V << " m=" << m << " stage " << s;
          const int inputs = interleaved->MaxInputsWithoutHead(s) +
                             (s == P - 1 ? interleaved->MaxInputs(s, V - 1) : 0);
          EXPECT_GE(inputs, together);
          EXPECT_LE(inputs, together + P + 1)
              << "P=" << P << " V=" << V << " m=" << m << " stage " << s;
        }
      }
    }
  }
}

TEST(PipelineScheduleTest, InterleavedBubbleApproachesTheVirtualStageBound) {
  // (P − 1)/(V·m) of the ideal step for large m (Narayanan et al. 2021 §2.2).
  auto schedule = PipelineSchedule::Create(PipelineScheduleKind::kInterleaved, 4, 2, 16);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto plain = PipelineSchedule::Create(PipelineScheduleKind::k1F1B, 4, 1, 16);
  ASSERT_TRUE(plain.ok());
  const double ideal = 3.0 * 16;  // every stage busy the whole time
  EXPECT_LT(schedule->SimulatedLength(), plain->SimulatedLength());
  EXPECT_LT((schedule->SimulatedLength() - ideal) / ideal, 1.5 * 3.0 / (2 * 16));
}

TEST(PipelineScheduleTest, SizesThatDoNotFitAreRefused) {
  EXPECT_THAT(PipelineSchedule::Create(PipelineScheduleKind::k1F1B, 2, 2, 4).status().message(),
              HasSubstr("virtual_stages 2 needs schedule: interleaved"));
  EXPECT_THAT(
      PipelineSchedule::Create(PipelineScheduleKind::kInterleaved, 2, 2, 3).status().message(),
      HasSubstr("groups of pp 2, got 3 micro-batches"));
  EXPECT_THAT(
      PipelineSchedule::Create(PipelineScheduleKind::kInterleaved, 1, 2, 2).status().message(),
      HasSubstr("needs pp >= 2"));
  EXPECT_FALSE(PipelineSchedule::Create(PipelineScheduleKind::k1F1B, 2, 1, 0).ok());
}

PipeAction Pass(PipeOp op, int mb) {
  PipeAction a;
  a.op = op;
  a.micro_batch = mb;
  return a;
}

PipeAction Transfer(PipeOp op, PipePayload payload, int mb, int peer) {
  PipeAction a;
  a.op = op;
  PipeMessage m{payload, mb, 0, peer};
  if (op == PipeOp::kSend) a.send = m;
  if (op == PipeOp::kRecv) a.recv = m;
  return a;
}

TEST(PipelineScheduleTest, TheAnalysisCatchesADeadlock) {
  // Both stages wait for the other's send first: with blocking transfers neither ever returns.
  std::vector<std::vector<PipeAction>> lists = {
      {Pass(PipeOp::kForward, 0), Transfer(PipeOp::kRecv, PipePayload::kGradient, 0, 1),
       Transfer(PipeOp::kSend, PipePayload::kActivation, 0, 1), Pass(PipeOp::kBackward, 0)},
      {Transfer(PipeOp::kRecv, PipePayload::kActivation, 0, 0), Pass(PipeOp::kForward, 0),
       Pass(PipeOp::kBackward, 0), Transfer(PipeOp::kSend, PipePayload::kGradient, 0, 0)}};
  auto schedule = PipelineSchedule::FromActions(PipelineScheduleKind::k1F1B, 1, 1, lists);
  ASSERT_FALSE(schedule.ok());
  EXPECT_THAT(schedule.status().message(), HasSubstr("deadlocks"));
  EXPECT_THAT(schedule.status().message(), HasSubstr("stage 0 at R[grad 0.0 <-1]"));

  // The same lists in a working order pass.
  std::swap(lists[0][1], lists[0][2]);
  auto fixed = PipelineSchedule::FromActions(PipelineScheduleKind::k1F1B, 1, 1, lists);
  EXPECT_TRUE(fixed.ok()) << fixed.status();
}

TEST(PipelineScheduleTest, TheAnalysisCatchesPassesOutOfOrder) {
  std::vector<std::vector<PipeAction>> backward_first = {
      {Pass(PipeOp::kBackward, 0), Pass(PipeOp::kForward, 0)}};
  EXPECT_THAT(PipelineSchedule::FromActions(PipelineScheduleKind::k1F1B, 1, 1, backward_first)
                  .status()
                  .message(),
              HasSubstr("a backward before its forward"));
  std::vector<std::vector<PipeAction>> unordered = {
      {Pass(PipeOp::kForward, 0), Pass(PipeOp::kForward, 1), Pass(PipeOp::kBackward, 1),
       Pass(PipeOp::kBackward, 0)}};
  EXPECT_THAT(PipelineSchedule::FromActions(PipelineScheduleKind::k1F1B, 1, 2, unordered)
                  .status()
                  .message(),
              HasSubstr("backwards out of micro-batch order"));
  std::vector<std::vector<PipeAction>> missing = {{Pass(PipeOp::kForward, 0)}};
  EXPECT_THAT(
      PipelineSchedule::FromActions(PipelineScheduleKind::k1F1B, 1, 1, missing).status().message(),
      HasSubstr("never runs the backward"));
}

TEST(ChunksOfTest, OneFOneBHasOneChunkPerStageAndInterleavedStridesByPp) {
  ParallelSpec spec;
  spec.pp = 2;
  auto plain = ChunksOf(spec, 8);
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->size(), 2u);
  EXPECT_EQ((*plain)[0].size(), 1u);
  EXPECT_EQ((*plain)[1][0].first, 4);

  spec.schedule = PipelineScheduleKind::kInterleaved;
  spec.virtual_stages = 2;
  auto chunks = ChunksOf(spec, 8);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  // Virtual stages 0..3 of 2 layers each: stage 0 holds 0 and 2, stage 1 holds 1 and 3.
  EXPECT_EQ((*chunks)[0][0].first, 0);
  EXPECT_EQ((*chunks)[0][1].first, 4);
  EXPECT_EQ((*chunks)[1][0].first, 2);
  EXPECT_EQ((*chunks)[1][1].first, 6);
  EXPECT_EQ((*chunks)[1][1].last, 8);

  EXPECT_THAT(ChunksOf(spec, 6).status().message(),
              HasSubstr("6 layers into pp·virtual_stages = 2·2 = 4 equal chunks"));
  spec.stage_layers = {4, 4};
  EXPECT_THAT(ChunksOf(spec, 8).status().message(), HasSubstr("stages cannot be given"));
  spec.stage_layers.clear();
  spec.schedule = PipelineScheduleKind::k1F1B;
  EXPECT_THAT(ChunksOf(spec, 8).status().message(),
              HasSubstr("virtual_stages 2 needs schedule: interleaved"));
}

}  // namespace
}  // namespace shardline::placement
