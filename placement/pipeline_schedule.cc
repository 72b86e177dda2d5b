#include "placement/pipeline_schedule.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace shardline::placement {
namespace {

PipeAction Compute(PipeOp op, int micro_batch, int chunk) {
  PipeAction a;
  a.op = op;
  a.micro_batch = micro_batch;
  a.chunk = chunk;
  return a;
}

PipeAction SendOf(PipeMessage m) {
  PipeAction a;
  a.op = PipeOp::kSend;
  a.send = m;
  return a;
}

PipeAction RecvOf(PipeMessage m) {
  PipeAction a;
  a.op = PipeOp::kRecv;
  a.recv = m;
  return a;
}

PipeAction SendRecvOf(PipeMessage send, PipeMessage recv) {
  PipeAction a;
  a.op = PipeOp::kSendRecv;
  a.send = send;
  a.recv = recv;
  return a;
}

PipeMessage Act(int micro_batch, int chunk, int peer) {
  return {PipePayload::kActivation, micro_batch, chunk, peer};
}
PipeMessage Grad(int micro_batch, int chunk, int peer) {
  return {PipePayload::kGradient, micro_batch, chunk, peer};
}

// 1F1B (PipeDream-Flush, Megatron-LM's non-interleaved schedule) for stage s: warm-up forwards,
// one forward and one backward in turn, cool-down backwards. Transfers in both directions that
// are in flight together go as one SendRecv (Megatron's send_forward_recv_backward and
// send_backward_recv_forward), so that neighbours never wait on each other.
std::vector<PipeAction> OneFOneB(int P, int s, int m) {
  const bool first = s == 0, last = s == P - 1;
  const int warmup = std::min(P - s - 1, m);
  const int remaining = m - warmup;
  std::vector<PipeAction> out;
  for (int i = 0; i < warmup; ++i) {
    if (!first) out.push_back(RecvOf(Act(i, 0, s - 1)));
    out.push_back(Compute(PipeOp::kForward, i, 0));
    if (!last) out.push_back(SendOf(Act(i, 0, s + 1)));
  }
  if (remaining > 0 && !first) out.push_back(RecvOf(Act(warmup, 0, s - 1)));
  for (int j = 0; j < remaining; ++j) {
    const int i = warmup + j;
    out.push_back(Compute(PipeOp::kForward, i, 0));
    if (!last) out.push_back(SendRecvOf(Act(i, 0, s + 1), Grad(j, 0, s + 1)));
    out.push_back(Compute(PipeOp::kBackward, j, 0));
    if (first) continue;
    if (j == remaining - 1) {
      out.push_back(SendOf(Grad(j, 0, s - 1)));
    } else {
      out.push_back(SendRecvOf(Grad(j, 0, s - 1), Act(i + 1, 0, s - 1)));
    }
  }
  for (int j = remaining; j < m; ++j) {
    if (!last) out.push_back(RecvOf(Grad(j, 0, s + 1)));
    out.push_back(Compute(PipeOp::kBackward, j, 0));
    if (!first) out.push_back(SendOf(Grad(j, 0, s - 1)));
  }
  return out;
}

// The interleaved schedule's order of passes on stage s (Megatron-LM's
// forward_backward_pipelining_with_interleaving): the k-th forward runs micro-batch
// group·P + k mod P of chunk (k mod P·V) / P, where group = k / (P·V); backwards visit the chunks
// in reverse. (P − s − 1)·2 + (V − 1)·P warm-up forwards (all of them when m = P), then one
// forward and one backward in turn, then the remaining backwards.
std::vector<PipeAction> InterleavedPasses(int P, int V, int s, int m) {
  const int total = m * V;
  const int warmup = m == P ? total : std::min((P - s - 1) * 2 + (V - 1) * P, total);
  const auto pass = [&](int k, bool forward) {
    const int in_group = k % (P * V);
    const int chunk = forward ? in_group / P : V - 1 - in_group / P;
    const int micro_batch = (k / (P * V)) * P + in_group % P;
    return Compute(forward ? PipeOp::kForward : PipeOp::kBackward, micro_batch, chunk);
  };
  std::vector<PipeAction> out;
  for (int k = 0; k < warmup; ++k) out.push_back(pass(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(pass(warmup + k, true));
    out.push_back(pass(k, false));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(pass(k, false));
  return out;
}

// Passes take 1/V (forward) and 2/V (backward) of a unit: a stage's whole forward is one unit
// whatever V, so that schedules of different V compare.
double Duration(const PipeAction& a, int V) { return (a.op == PipeOp::kForward ? 1.0 : 2.0) / V; }

// Turns each stage's order of passes into action lists with the transfers placed. The passes are
// timed as early as their inputs allow (Duration each); every transfer is an event at the time its
// producer finishes. (Placing an activation's transfer at its consumer's start instead takes the
// receiver's slot later, but with blocking transfers the producer then waits for a consumer still
// busy with another pass: the simulated bubble of pp 2, virtual_stages 2, 4 micro-batches grew
// from below 1F1B's to 0.20.) All events sorted by time (a transfer before the passes that start
// when it happens) form one total order, and each stage's list is that order's projection onto the
// stage. Executing projections of one total order cannot deadlock with blocking sends and
// receives: the first event not yet done has every participant waiting on it. A send next to a
// receive on one stage is then merged into one SendRecv, which only lets a transfer happen sooner.
absl::StatusOr<std::vector<std::vector<PipeAction>>> PlaceTransfers(
    int P, int V, int m, const std::vector<std::vector<PipeAction>>& passes) {
  const int VP = V * P;
  // done[forward?][micro_batch][virtual stage]: when the pass finished, < 0 while not yet.
  std::vector<std::vector<std::vector<double>>> done(
      2, std::vector<std::vector<double>>(m, std::vector<double>(VP, -1.0)));
  struct Event {
    double time;
    int order;  // 0: a transfer, 1: a pass
    int stage;
    int index;  // a pass: its index in the stage's order; a transfer: its sequence number
  };
  struct Transfer {
    int from, to;
    PipeMessage send, recv;
  };
  std::vector<Event> events;
  std::vector<Transfer> transfers;
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0.0);
  size_t remaining = 0;
  for (const auto& list : passes) remaining += list.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < P; ++s) {
      if (next[s] >= passes[s].size()) continue;
      const PipeAction& a = passes[s][next[s]];
      const int v = a.chunk * P + s;
      const bool forward = a.op == PipeOp::kForward;
      double ready = free_at[s];
      if (forward && v > 0) {
        if (done[1][a.micro_batch][v - 1] < 0) continue;
        ready = std::max(ready, done[1][a.micro_batch][v - 1]);
      }
      if (!forward) {
        if (done[1][a.micro_batch][v] < 0) continue;
        ready = std::max(ready, done[1][a.micro_batch][v]);
        if (v + 1 < VP) {
          if (done[0][a.micro_batch][v + 1] < 0) continue;
          ready = std::max(ready, done[0][a.micro_batch][v + 1]);
        }
      }
      const double end = ready + Duration(a, V);
      done[forward ? 1 : 0][a.micro_batch][v] = end;
      free_at[s] = end;
      events.push_back({ready, 1, s, static_cast<int>(next[s])});
      // What this pass produces for a neighbour.
      if (forward && v + 1 < VP) {
        const int to = (v + 1) % P;
        transfers.push_back(
            {s, to, Act(a.micro_batch, a.chunk, to), Act(a.micro_batch, (v + 1) / P, s)});
        events.push_back({end, 0, s, static_cast<int>(transfers.size() - 1)});
      } else if (!forward && v > 0) {
        const int to = (v - 1) % P;
        transfers.push_back(
            {s, to, Grad(a.micro_batch, a.chunk, to), Grad(a.micro_batch, (v - 1) / P, s)});
        events.push_back({end, 0, s, static_cast<int>(transfers.size() - 1)});
      }
      ++next[s];
      --remaining;
      progressed = true;
    }
    if (!progressed) {
      return absl::InternalError(absl::StrCat("the interleaved order of passes for pp ", P,
                                              ", virtual_stages ", V, ", ", m,
                                              " micro-batches waits on itself"));
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.time, a.order, a.stage, a.index) <
           std::tie(b.time, b.order, b.stage, b.index);
  });
  std::vector<std::vector<PipeAction>> lists(P);
  for (const Event& e : events) {
    if (e.order == 1) {
      lists[e.stage].push_back(passes[e.stage][e.index]);
      continue;
    }
    const Transfer& t = transfers[e.index];
    lists[t.from].push_back(SendOf(t.send));
    lists[t.to].push_back(RecvOf(t.recv));
  }
  // Merge a send and a receive that stand next to each other.
  for (std::vector<PipeAction>& list : lists) {
    std::vector<PipeAction> merged;
    for (const PipeAction& a : list) {
      if (!merged.empty()) {
        PipeAction& prev = merged.back();
        if (prev.op == PipeOp::kSend && a.op == PipeOp::kRecv) {
          prev = SendRecvOf(prev.send, a.recv);
          continue;
        }
        if (prev.op == PipeOp::kRecv && a.op == PipeOp::kSend) {
          prev = SendRecvOf(a.send, prev.recv);
          continue;
        }
      }
      merged.push_back(a);
    }
    list = std::move(merged);
  }
  return lists;
}

// The step's length when transfers take no time and a send never waits for its receiver (the
// shared-memory backend's mailbox holds two messages of up to 256 KiB per direction, Gloo's
// sockets buffer theirs): a receive completes once its message was sent. Expects lists that the
// rendezvous analysis passed (they cannot deadlock here, where sends wait less).
double EagerLength(const std::vector<std::vector<PipeAction>>& lists, int V) {
  const int P = static_cast<int>(lists.size());
  std::vector<size_t> pc(P, 0);
  std::vector<double> clock(P, 0.0);
  // Per (from, to): the times its messages were sent, in order; and how many were taken.
  std::vector<std::vector<std::vector<double>>> sent(P, std::vector<std::vector<double>>(P));
  std::vector<std::vector<size_t>> taken(P, std::vector<size_t>(P, 0));
  std::vector<char> send_posted(P, 0);  // the send half of the current action went out
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < P; ++s) {
      while (pc[s] < lists[s].size()) {
        const PipeAction& a = lists[s][pc[s]];
        if (a.op == PipeOp::kForward || a.op == PipeOp::kBackward) {
          clock[s] += Duration(a, V);
        } else {
          const bool has_recv = a.op == PipeOp::kRecv || a.op == PipeOp::kSendRecv;
          if ((a.op == PipeOp::kSend || a.op == PipeOp::kSendRecv) && !send_posted[s]) {
            sent[s][a.send.peer].push_back(clock[s]);
            send_posted[s] = 1;
            progressed = true;
          }
          if (has_recv && taken[a.recv.peer][s] >= sent[a.recv.peer][s].size()) break;
          send_posted[s] = 0;
          if (has_recv) {
            clock[s] = std::max(clock[s], sent[a.recv.peer][s][taken[a.recv.peer][s]++]);
          }
        }
        ++pc[s];
        progressed = true;
      }
    }
  }
  return *std::max_element(clock.begin(), clock.end());
}

std::string MessageString(const PipeMessage& m, bool send) {
  return absl::StrCat(m.payload == PipePayload::kActivation ? "act " : "grad ", m.micro_batch, ".",
                      m.chunk, send ? " ->" : " <-", m.peer);
}

}  // namespace

std::string DebugString(const PipeAction& a) {
  switch (a.op) {
    case PipeOp::kForward:
      return absl::StrCat("F", a.micro_batch, ".", a.chunk);
    case PipeOp::kBackward:
      return absl::StrCat("B", a.micro_batch, ".", a.chunk);
    case PipeOp::kSend:
      return absl::StrCat("S[", MessageString(a.send, true), "]");
    case PipeOp::kRecv:
      return absl::StrCat("R[", MessageString(a.recv, false), "]");
    case PipeOp::kSendRecv:
      return absl::StrCat("SR[", MessageString(a.send, true), " | ", MessageString(a.recv, false),
                          "]");
  }
  return "?";
}

absl::StatusOr<PipelineSchedule> PipelineSchedule::Create(PipelineScheduleKind kind, int pp,
                                                          int virtual_stages, int micro_batches) {
  if (pp < 1 || micro_batches < 1 || virtual_stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pipeline schedule needs pp, virtual_stages and micro-batches >= 1, got pp ", pp,
        ", virtual_stages ", virtual_stages, ", ", micro_batches, " micro-batches"));
  }
  PipelineSchedule schedule;
  schedule.kind_ = kind;
  schedule.pp_ = pp;
  schedule.virtual_stages_ = virtual_stages;
  schedule.micro_batches_ = micro_batches;
  if (kind == PipelineScheduleKind::k1F1B) {
    if (virtual_stages != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "virtual_stages ", virtual_stages, " needs schedule: interleaved (1f1b runs one chunk)"));
    }
    for (int s = 0; s < pp; ++s) schedule.actions_.push_back(OneFOneB(pp, s, micro_batches));
  } else {
    if (pp < 2 || virtual_stages < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule: interleaved needs pp >= 2 and virtual_stages >= 2, got pp ", pp,
                       ", virtual_stages ", virtual_stages));
    }
    if (micro_batches % pp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule: interleaved runs micro-batches in groups of pp ", pp, ", got ",
                       micro_batches, " micro-batches"));
    }
    std::vector<std::vector<PipeAction>> passes;
    for (int s = 0; s < pp; ++s) {
      passes.push_back(InterleavedPasses(pp, virtual_stages, s, micro_batches));
    }
    ASSIGN_OR_RETURN(schedule.actions_, PlaceTransfers(pp, virtual_stages, micro_batches, passes));
  }
  RETURN_IF_ERROR(schedule.Analyse());
  return schedule;
}

absl::StatusOr<PipelineSchedule> PipelineSchedule::FromActions(
    PipelineScheduleKind kind, int virtual_stages, int micro_batches,
    std::vector<std::vector<PipeAction>> lists) {
  if (lists.empty() || virtual_stages < 1 || micro_batches < 1) {
    return absl::InvalidArgumentError(
        "a pipeline schedule needs a stage, a chunk and a micro-batch");
  }
  PipelineSchedule schedule;
  schedule.kind_ = kind;
  schedule.pp_ = static_cast<int>(lists.size());
  schedule.virtual_stages_ = virtual_stages;
  schedule.micro_batches_ = micro_batches;
  schedule.actions_ = std::move(lists);
  RETURN_IF_ERROR(schedule.Analyse());
  return schedule;
}

absl::StatusOr<PipelineSchedule> PipelineSchedule::Of(const ParallelSpec& spec, int micro_batches) {
  return Create(spec.schedule, spec.pp, spec.virtual_stages, micro_batches);
}

// Runs every stage's list against the others: a pass runs when its stage reaches it (after
// checking that its inputs are there), a send half and a receive half complete together when both
// stages have reached them (rendezvous), and a SendRecv completes when both its halves have.
// Clocks advance by Duration per pass; a transfer happens at the later of its two stages' clocks.
absl::Status PipelineSchedule::Analyse() {
  const int P = pp_, V = virtual_stages_, m = micro_batches_;
  const int VP = P * V;
  const std::string where =
      absl::StrCat(std::string(PipelineScheduleName(kind_)), " schedule for pp ", P,
                   ", virtual_stages ", V, ", ", m, " micro-batches");
  const auto bug = [&](int s, const PipeAction& a, const std::string& what) {
    return absl::InternalError(
        absl::StrCat(where, ": stage ", s, " at ", DebugString(a), ": ", what));
  };
  struct Live {
    std::vector<int> now, most;
    int now_body = 0, most_body = 0;
    void Resize(int V) { now.assign(V, 0), most.assign(V, 0); }
    void Take(int chunk, bool head) {
      most[chunk] = std::max(most[chunk], ++now[chunk]);
      if (!head) most_body = std::max(most_body, ++now_body);
    }
    void Release(int chunk, bool head) {
      --now[chunk];
      if (!head) --now_body;
    }
  };
  struct StageState {
    size_t pc = 0;
    bool send_done = false, recv_done = false;
    double clock = 0, busy = 0;
    // Per (micro_batch, chunk).
    std::vector<std::vector<char>> have_input, forwarded, have_grad, backwarded;
    std::vector<int> next_backward;  // per chunk: backwards run in micro-batch order
    int last_backward_mb = -1, last_backward_chunk = -1;
    // Activation slots and early gradients in use, per chunk and in all.
    // Micro-batches whose backward has not run: by forward (the activations a slot keeps) and by
    // input (received, or embedded), per chunk and over the chunks but the head's.
    Live forwards, inputs;
    int early = 0, max_early = 0;
    std::vector<std::vector<char>> early_grad;
  };
  std::vector<StageState> st(P);
  for (StageState& s : st) {
    s.have_input.assign(m, std::vector<char>(V, 0));
    s.forwarded = s.have_grad = s.backwarded = s.early_grad = s.have_input;
    s.next_backward.assign(V, 0);
    s.forwards.Resize(V);
    s.inputs.Resize(V);
  }
  // The head's chunk: the last one of the last stage.
  const auto is_head = [&](const StageState& s, int chunk) {
    return &s == &st[P - 1] && chunk == V - 1;
  };

  // A received gradient lands where its backward reads it (the backward's working buffer) unless
  // something writes there first: another backward, or another gradient's receive. Forwards do
  // not touch it. Then it is held apart.
  const auto receives_gradient = [](const PipeAction& a) {
    return (a.op == PipeOp::kRecv || a.op == PipeOp::kSendRecv) &&
           a.recv.payload == PipePayload::kGradient;
  };
  for (std::vector<PipeAction>& list : actions_) {
    for (size_t k = 0; k < list.size(); ++k) {
      PipeAction& a = list[k];
      a.held = false;
      if (!receives_gradient(a)) continue;
      for (size_t x = k + 1; x < list.size(); ++x) {
        const PipeAction& b = list[x];
        if (b.op == PipeOp::kBackward) {
          a.held = b.micro_batch != a.recv.micro_batch || b.chunk != a.recv.chunk;
          break;
        }
        if (receives_gradient(b)) {
          a.held = true;
          break;
        }
      }
    }
  }
  // A receive's content as the receiver expects it, from the sender's send.
  const auto expected_recv = [&](int from, const PipeMessage& send) {
    const int v = send.chunk * P + from;
    const int w = send.payload == PipePayload::kActivation ? v + 1 : v - 1;
    return PipeMessage{send.payload, send.micro_batch, w / P, from};
  };

  for (;;) {
    bool all_done = true, progressed = false;
    for (int s = 0; s < P; ++s) {
      StageState& me = st[s];
      const std::vector<PipeAction>& list = actions_[s];
      if (me.pc >= list.size()) continue;
      all_done = false;
      const PipeAction& a = list[me.pc];
      if (a.op == PipeOp::kForward || a.op == PipeOp::kBackward) {
        if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= V) {
          return bug(s, a, "micro-batch or chunk out of range");
        }
        const int v = a.chunk * P + s;
        const int mb = a.micro_batch, c = a.chunk;
        if (a.op == PipeOp::kForward) {
          if (me.forwarded[mb][c]) return bug(s, a, "a second forward");
          if (v > 0 && !me.have_input[mb][c]) return bug(s, a, "its input was not received");
          if (v == 0) me.inputs.Take(c, is_head(me, c));
          me.forwards.Take(c, is_head(me, c));
          me.forwarded[mb][c] = 1;
        } else {
          if (!me.forwarded[mb][c]) return bug(s, a, "a backward before its forward");
          if (me.backwarded[mb][c]) return bug(s, a, "a second backward");
          if (v + 1 < VP && !me.have_grad[mb][c]) return bug(s, a, "its gradient was not received");
          if (me.next_backward[c] != mb) return bug(s, a, "backwards out of micro-batch order");
          ++me.next_backward[c];
          me.backwarded[mb][c] = 1;
          me.forwards.Release(c, is_head(me, c));
          me.inputs.Release(c, is_head(me, c));
          if (me.early_grad[mb][c]) --me.early;
          me.last_backward_mb = mb;
          me.last_backward_chunk = c;
        }
        const double d = Duration(a, V);
        me.clock += d;
        me.busy += d;
        ++me.pc;
        progressed = true;
        continue;
      }
      // A transfer: complete whichever halves have their partner waiting.
      const bool has_send = a.op == PipeOp::kSend || a.op == PipeOp::kSendRecv;
      if (has_send && !me.send_done) {
        const PipeMessage& msg = a.send;
        if (msg.peer < 0 || msg.peer >= P || msg.peer == s) return bug(s, a, "a bad peer");
        if (msg.micro_batch < 0 || msg.micro_batch >= m || msg.chunk < 0 || msg.chunk >= V) {
          return bug(s, a, "micro-batch or chunk out of range");
        }
        if (msg.payload == PipePayload::kActivation && !me.forwarded[msg.micro_batch][msg.chunk]) {
          return bug(s, a, "sends an activation not yet computed");
        }
        if (msg.payload == PipePayload::kGradient &&
            (me.last_backward_mb != msg.micro_batch || me.last_backward_chunk != msg.chunk)) {
          // The engine sends a gradient from the backward's working buffer, which the next
          // backward overwrites.
          return bug(s, a, "sends a gradient other than the last backward's");
        }
        StageState& peer = st[msg.peer];
        if (peer.pc < actions_[msg.peer].size()) {
          const PipeAction& b = actions_[msg.peer][peer.pc];
          const bool peer_recv = (b.op == PipeOp::kRecv || b.op == PipeOp::kSendRecv) &&
                                 !peer.recv_done && b.recv.peer == s;
          if (peer_recv) {
            if (b.recv != expected_recv(s, msg)) {
              return bug(msg.peer, b,
                         absl::StrCat("receives what stage ", s, " sends as ", DebugString(a)));
            }
            const double t = std::max(me.clock, peer.clock);
            me.clock = peer.clock = t;
            me.send_done = true;
            peer.recv_done = true;
            // The receiver's bookkeeping.
            const int mb = b.recv.micro_batch, c = b.recv.chunk;
            if (b.recv.payload == PipePayload::kActivation) {
              if (peer.have_input[mb][c]) return bug(msg.peer, b, "a second input");
              peer.have_input[mb][c] = 1;
              peer.inputs.Take(c, is_head(peer, c));
            } else {
              if (peer.have_grad[mb][c]) return bug(msg.peer, b, "a second gradient");
              peer.have_grad[mb][c] = 1;
              if (b.held) {
                peer.early_grad[mb][c] = 1;
                peer.max_early = std::max(peer.max_early, ++peer.early);
              }
            }
            progressed = true;
          }
        }
      }
      // Finish actions whose halves are all done (also the peer's, completed just now).
      for (int x : {s, a.op == PipeOp::kRecv ? -1 : (has_send ? a.send.peer : -1)}) {
        if (x < 0) continue;
        StageState& who = st[x];
        if (who.pc >= actions_[x].size()) continue;
        const PipeAction& b = actions_[x][who.pc];
        if (b.op == PipeOp::kForward || b.op == PipeOp::kBackward) continue;
        const bool needs_send = b.op == PipeOp::kSend || b.op == PipeOp::kSendRecv;
        const bool needs_recv = b.op == PipeOp::kRecv || b.op == PipeOp::kSendRecv;
        if ((!needs_send || who.send_done) && (!needs_recv || who.recv_done)) {
          ++who.pc;
          who.send_done = who.recv_done = false;
          progressed = true;
        }
      }
    }
    if (all_done) break;
    if (!progressed) {
      std::vector<std::string> waiting;
      for (int s = 0; s < P; ++s) {
        if (st[s].pc < actions_[s].size()) {
          waiting.push_back(absl::StrCat("stage ", s, " at ", DebugString(actions_[s][st[s].pc])));
        }
      }
      return absl::InternalError(absl::StrCat(where, " deadlocks: ", absl::StrJoin(waiting, ", ")));
    }
  }
  double length = 0, busy = 0;
  max_in_flight_.clear();
  max_in_flight_body_.clear();
  max_inputs_.clear();
  max_inputs_body_.clear();
  max_early_gradients_.clear();
  for (int s = 0; s < P; ++s) {
    for (int mb = 0; mb < m; ++mb) {
      for (int c = 0; c < V; ++c) {
        if (!st[s].backwarded[mb][c]) {
          return absl::InternalError(absl::StrCat(where, ": stage ", s,
                                                  " never runs the backward "
                                                  "of micro-batch ",
                                                  mb, " chunk ", c));
        }
      }
    }
    length = std::max(length, st[s].clock);
    busy += st[s].busy;
    max_in_flight_.push_back(st[s].forwards.most);
    max_in_flight_body_.push_back(st[s].forwards.most_body);
    max_inputs_.push_back(st[s].inputs.most);
    max_inputs_body_.push_back(st[s].inputs.most_body);
    max_early_gradients_.push_back(st[s].max_early);
  }
  rendezvous_length_ = length;
  simulated_length_ = EagerLength(actions_, V);
  simulated_bubble_ = 1.0 - busy / (P * simulated_length_);
  return absl::OkStatus();
}

}  // namespace shardline::placement
