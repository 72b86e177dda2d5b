// The layout on the wire: what the coordinator writes into an Assignment
// (coordinator/layout_wire.h) the actor reads back (worker/actor/layout_wire.h) field for field,
// the schedule and the recomputation as the schema's enums; a layout from a coordinator older
// than them reads as 1F1B without recomputation, and an enumerant this build does not know is
// refused.
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/layout_wire.h"
#include "worker/actor/layout_wire.h"

namespace shardline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Through bytes, as an Assignment travels.
absl::StatusOr<placement::ParallelSpec> RoundTrip(const placement::ParallelSpec& parallel) {
  capnp::MallocMessageBuilder builder;
  coordinator::FillParallelLayout(parallel, builder.initRoot<wire::ParallelLayout>());
  const kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  capnp::FlatArrayMessageReader reader(words.asPtr());
  return actor::ParallelSpecFromWire(reader.getRoot<wire::ParallelLayout>());
}

TEST(LayoutWireTest, EveryFieldRoundTrips) {
  placement::ParallelSpec parallel;
  parallel.tp = 2;
  parallel.pp = 4;
  parallel.dp = 8;
  parallel.zero = 3;
  parallel.micro_batch = 3;
  parallel.schedule = placement::PipelineScheduleKind::kInterleaved;
  parallel.virtual_stages = 4;
  for (const placement::RecomputeMode mode :
       {placement::RecomputeMode::kNone, placement::RecomputeMode::kSelective,
        placement::RecomputeMode::kFull}) {
    parallel.recompute = mode;
    absl::StatusOr<placement::ParallelSpec> back = RoundTrip(parallel);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->tp, 2);
    EXPECT_EQ(back->pp, 4);
    EXPECT_EQ(back->dp, 8);
    EXPECT_EQ(back->zero, 3);
    EXPECT_EQ(back->micro_batch, 3);
    EXPECT_TRUE(back->stage_layers.empty());
    EXPECT_EQ(back->schedule, placement::PipelineScheduleKind::kInterleaved);
    EXPECT_EQ(back->virtual_stages, 4);
    EXPECT_EQ(back->recompute, mode) << placement::RecomputeModeName(mode);
  }
  placement::ParallelSpec plain;
  plain.pp = 3;
  plain.stage_layers = {2, 5, 1};
  absl::StatusOr<placement::ParallelSpec> back = RoundTrip(plain);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_THAT(back->stage_layers, ElementsAre(2, 5, 1));
  EXPECT_EQ(back->schedule, placement::PipelineScheduleKind::k1F1B);
  EXPECT_EQ(back->virtual_stages, 1);
  EXPECT_EQ(back->recompute, placement::RecomputeMode::kNone);
}

TEST(LayoutWireTest, AnOlderCoordinatorsLayoutIsOneFOneBWithoutRecomputation) {
  // What a coordinator from before the schedules wrote: the degrees only.
  capnp::MallocMessageBuilder builder;
  auto layout = builder.initRoot<wire::ParallelLayout>();
  layout.setTp(1);
  layout.setPp(2);
  layout.setDp(1);
  absl::StatusOr<placement::ParallelSpec> back =
      actor::ParallelSpecFromWire(builder.getRoot<wire::ParallelLayout>().asReader());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->pp, 2);
  EXPECT_EQ(back->schedule, placement::PipelineScheduleKind::k1F1B);
  EXPECT_EQ(back->virtual_stages, 1);
  EXPECT_EQ(back->recompute, placement::RecomputeMode::kNone);
}

TEST(LayoutWireTest, UnknownEnumerantsAreRefusedAndHugeDegreesClamped) {
  capnp::MallocMessageBuilder builder;
  auto layout = builder.initRoot<wire::ParallelLayout>();
  layout.setTp(0xffffffffu);
  layout.setSchedule(static_cast<wire::PipelineSchedule>(7));
  EXPECT_THAT(std::string(actor::ParallelSpecFromWire(layout.asReader()).status().message()),
              HasSubstr("unknown pipeline schedule enumerant 7"));
  layout.setSchedule(wire::PipelineSchedule::ONE_F_ONE_B);
  layout.setRecompute(static_cast<wire::RecomputeMode>(9));
  EXPECT_THAT(std::string(actor::ParallelSpecFromWire(layout.asReader()).status().message()),
              HasSubstr("unknown recompute mode enumerant 9"));
  layout.setRecompute(wire::RecomputeMode::FULL);
  absl::StatusOr<placement::ParallelSpec> back = actor::ParallelSpecFromWire(layout.asReader());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tp, 1 << 30);  // ApplyPlannedLayout refuses it, with its own message
}

}  // namespace
}  // namespace shardline
