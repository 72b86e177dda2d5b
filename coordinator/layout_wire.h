// A train or serve job's layout as the coordinator sends it in an Assignment: every field of
// placement::ParallelSpec, the schedule and the recomputation as enums of the schema (never as
// strings). worker/actor/layout_wire.h reads it back.
#pragma once

#include "placement/parallel_layout.h"
#include "protocol/shardline.capnp.h"

namespace shardline::coordinator {

void FillParallelLayout(const placement::ParallelSpec& parallel, wire::ParallelLayout::Builder out);

}  // namespace shardline::coordinator
