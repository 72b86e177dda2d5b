// Pipeline schedules as data: for every stage, the list of actions (compute a micro-batch's
// forward or backward through one chunk of layers, send or receive an activation or a gradient)
// that the engine executes in order, as Megatron-Core's schedules drive its layers. The list is
// all a stage needs to know: the engine (worker/model/sharded_gpt.cc) runs it without knowing
// which schedule made it, and the cost model prices a schedule by its lists (the activations a
// stage keeps in flight, the gradients it must hold, the bubble of a step of unit-time passes).
//
// Pure arithmetic: no communicator, no I/O. Create checks every schedule it builds by running all
// stages' lists against each other with blocking (rendezvous) sends and receives, so a schedule
// that could deadlock or feed a pass the wrong micro-batch is an Internal error, never a hang.
//
// Stages talk only to their pipeline neighbours: an activation of virtual stage v goes to the
// stage that runs v + 1, its gradient back to the one that runs v − 1 (virtual stage v = chunk ·
// pp + stage, so the last stage's chunk c feeds the first stage's chunk c + 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/parallel_layout.h"

namespace shardline::placement {

enum class PipePayload : uint8_t {
  kActivation,  // a chunk's output, to the next virtual stage
  kGradient,    // the gradient of a chunk's input, to the previous virtual stage
};

// One message between two stages: what, of which micro-batch and chunk, and the peer stage (the
// receiver of a send, the sender of a receive). `chunk` is the chunk on the stage whose list
// holds the action: a send's chunk produced it, a receive's chunk consumes it.
struct PipeMessage {
  PipePayload payload = PipePayload::kActivation;
  int micro_batch = 0;
  int chunk = 0;
  int peer = 0;
  bool operator==(const PipeMessage&) const = default;
};

enum class PipeOp : uint8_t {
  kForward,   // micro_batch through chunk `chunk`'s layers (and the embedding / the loss at the
              // ends)
  kBackward,  // its backward, accumulating the parameters' gradients
  kSend,      // `send`
  kRecv,      // `recv`
  kSendRecv,  // `send` and `recv` in flight together (Communicator::SendRecv)
};

struct PipeAction {
  PipeOp op = PipeOp::kForward;
  int micro_batch = 0;  // kForward, kBackward
  int chunk = 0;
  PipeMessage send;  // kSend, kSendRecv
  PipeMessage recv;  // kRecv, kSendRecv
  // A gradient receive followed, before its backward, by another backward or gradient receive
  // (which write where the backward reads): the gradient waits in a buffer of its own
  // (MaxEarlyGradients). Set by the analysis.
  bool held = false;
  bool operator==(const PipeAction&) const = default;
};

// "F3.1" (forward of micro-batch 3, chunk 1), "B3.1", "S[act 3.1 ->2]", "R[grad 3.0 <-1]",
// "SR[act 3.1 ->2 | grad 2.1 <-2]": for tests and errors.
std::string DebugString(const PipeAction& action);

class PipelineSchedule {
 public:
  // The schedule `kind` for `pp` stages of `virtual_stages` chunks each and `micro_batches`
  // micro-batches per step. InvalidArgument for sizes that do not fit (pp, micro_batches < 1;
  // 1F1B with virtual_stages != 1; interleaved with pp < 2, virtual_stages < 2 or micro_batches
  // not a multiple of pp, as ValidateParallel says).
  static absl::StatusOr<PipelineSchedule> Create(PipelineScheduleKind kind, int pp,
                                                 int virtual_stages, int micro_batches);
  // A schedule from hand-written lists, one per stage, checked as Create checks its own
  // (Internal naming the stage and action that would deadlock or run out of order).
  static absl::StatusOr<PipelineSchedule> FromActions(PipelineScheduleKind kind, int virtual_stages,
                                                      int micro_batches,
                                                      std::vector<std::vector<PipeAction>> lists);
  // The schedule of a validated spec for `micro_batches` micro-batches.
  static absl::StatusOr<PipelineSchedule> Of(const ParallelSpec& spec, int micro_batches);

  PipelineScheduleKind kind() const { return kind_; }
  int pp() const { return pp_; }
  int virtual_stages() const { return virtual_stages_; }
  int micro_batches() const { return micro_batches_; }

  // Stage `stage`'s actions, in the order it runs them. Every stage runs each (micro-batch,
  // chunk)'s forward once and its backward once after it; backwards of one chunk run in
  // micro-batch order (the order gradients accumulate in).
  const std::vector<PipeAction>& Actions(int stage) const { return actions_[stage]; }

  // The most micro-batches of `chunk` whose activations stage `stage` keeps at once, from their
  // forward to the end of their backward. 1F1B: min(pp − stage, micro-batches).
  int MaxInFlight(int stage, int chunk) const { return max_in_flight_[stage][chunk]; }
  // The same at once over all of the stage's chunks but the one holding the head (the last
  // stage's last chunk), whose activations differ: chunks of equal layers can share this many
  // slots. 1F1B: MaxInFlight(stage, 0), but 0 on the last stage.
  int MaxInFlightWithoutHead(int stage) const { return max_in_flight_body_[stage]; }
  // The most inputs (a chunk's first activation) held at once, from their receive (or the
  // embedding) to the end of their backward: an input can arrive before its forward, since a
  // send does not wait for its receiver's turn. 1F1B: equal to the forwards in flight.
  int MaxInputs(int stage, int chunk) const { return max_inputs_[stage][chunk]; }
  int MaxInputsWithoutHead(int stage) const { return max_inputs_body_[stage]; }
  // The most gradients stage `stage` holds apart at once (PipeAction::held): received but not yet
  // consumed, with another backward or gradient receive before their own backward. 1F1B: 0. The
  // engine keeps this many gradient buffers.
  int MaxEarlyGradients(int stage) const { return max_early_gradients_[stage]; }

  // The step simulated with a stage's whole forward taking 1 unit and its backward 2 (a chunk's
  // 1/v and 2/v), and transfers free: its length in units and its bubble, the share of pp × length
  // in which stages idle. A send completes without waiting for its receiver, as the CPU backends'
  // buffered sends of activations up to 256 KiB do (larger ones wait: RendezvousLength).
  // 1F1B: (pp − 1)/(m + pp − 1); interleaved lower, about (pp − 1)/(v·m) for many micro-batches.
  double SimulatedLength() const { return simulated_length_; }
  double SimulatedBubble() const { return simulated_bubble_; }
  // The same step when every send waits for its receiver (rendezvous): never shorter.
  double RendezvousLength() const { return rendezvous_length_; }

 private:
  PipelineSchedule() = default;
  // Fills the derived numbers and checks the lists (see the top of this file).
  absl::Status Analyse();

  PipelineScheduleKind kind_ = PipelineScheduleKind::k1F1B;
  int pp_ = 1, virtual_stages_ = 1, micro_batches_ = 1;
  std::vector<std::vector<PipeAction>> actions_;
  std::vector<std::vector<int>> max_in_flight_;
  std::vector<int> max_in_flight_body_;
  std::vector<std::vector<int>> max_inputs_;
  std::vector<int> max_inputs_body_;
  std::vector<int> max_early_gradients_;
  double simulated_length_ = 0, simulated_bubble_ = 0, rendezvous_length_ = 0;
};

}  // namespace shardline::placement
