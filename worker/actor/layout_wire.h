// The layout an Assignment carries (coordinator/layout_wire.h writes it), read back into a
// placement::ParallelSpec for ApplyPlannedLayout. A layout from a coordinator older than the
// schedules has neither schedule nor recompute: 1F1B, one chunk, no recomputation.
#pragma once

#include "absl/status/statusor.h"
#include "placement/parallel_layout.h"
#include "protocol/shardline.capnp.h"

namespace shardline::actor {

// Degrees and counts are clamped so that no wire value wraps negative (ApplyPlannedLayout then
// refuses what is too big). InvalidArgument for a schedule or recompute enumerant this build does
// not know (a newer coordinator's): never guessed.
absl::StatusOr<placement::ParallelSpec> ParallelSpecFromWire(wire::ParallelLayout::Reader layout);

}  // namespace shardline::actor
