#include "worker/serving/step_message.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::serving {
namespace {

constexpr int kCounts = 4;        // N, sequences, blocks per sequence, logit rows
constexpr int kSamplingInts = 7;  // temperature, top_k, top_p, seed (2), draw (2)

int32_t FloatBits(float f) {
  int32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

float BitsFloat(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void PutU64(std::vector<int32_t>& out, uint64_t v) {
  out.push_back(static_cast<int32_t>(static_cast<uint32_t>(v)));
  out.push_back(static_cast<int32_t>(static_cast<uint32_t>(v >> 32)));
}

uint64_t GetU64(const int32_t* p) {
  return uint64_t{static_cast<uint32_t>(p[0])} | (uint64_t{static_cast<uint32_t>(p[1])} << 32);
}

}  // namespace

model::PagedStep StepMessage::View() const {
  return model::PagedStep{.tokens = tokens,
                          .positions = positions,
                          .token_seq = token_seq,
                          .block_tables = block_tables,
                          .num_seqs = num_seqs,
                          .max_blocks_per_seq = max_blocks_per_seq,
                          .logit_rows = logit_rows};
}

std::vector<int32_t> EncodeStep(const model::PagedStep& step,
                                std::span<const model::RowSampling> sampling) {
  std::vector<int32_t> out;
  out.reserve(kCounts + 3 * step.tokens.size() + step.block_tables.size() +
              step.logit_rows.size() * (1 + kSamplingInts));
  out.push_back(static_cast<int32_t>(step.tokens.size()));
  out.push_back(step.num_seqs);
  out.push_back(step.max_blocks_per_seq);
  out.push_back(static_cast<int32_t>(step.logit_rows.size()));
  out.insert(out.end(), step.tokens.begin(), step.tokens.end());
  out.insert(out.end(), step.positions.begin(), step.positions.end());
  out.insert(out.end(), step.token_seq.begin(), step.token_seq.end());
  out.insert(out.end(), step.block_tables.begin(), step.block_tables.end());
  out.insert(out.end(), step.logit_rows.begin(), step.logit_rows.end());
  for (const model::RowSampling& row : sampling) {
    out.push_back(FloatBits(row.options.temperature));
    out.push_back(row.options.top_k);
    out.push_back(FloatBits(row.options.top_p));
    PutU64(out, row.options.seed);
    PutU64(out, row.draw);
  }
  return out;
}

absl::StatusOr<StepMessage> DecodeStep(std::span<const int32_t> payload,
                                       const model::PagedCacheOptions& limits) {
  if (payload.size() < kCounts) {
    return absl::InvalidArgumentError(absl::StrCat("step message: ", payload.size(),
                                                   " ints, fewer than its ", kCounts, " counts"));
  }
  const int64_t n = payload[0], seqs = payload[1], blocks = payload[2], rows = payload[3];
  if (n < 1 || n > limits.max_tokens_per_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("step message: ", n, " tokens, outside 1..", limits.max_tokens_per_step));
  }
  if (seqs < 1 || seqs > limits.max_seqs_per_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("step message: ", seqs, " sequences, outside 1..", limits.max_seqs_per_step));
  }
  if (blocks < 1 || blocks > limits.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step message: ", blocks, " blocks per sequence, outside 1..", limits.num_blocks));
  }
  if (rows < 0 || rows > seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("step message: ", rows, " logit rows for ", seqs, " sequences"));
  }
  const int64_t expected = kCounts + 3 * n + seqs * blocks + rows * (1 + kSamplingInts);
  if (static_cast<int64_t>(payload.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("step message: ", payload.size(), " ints where its counts make ", expected));
  }
  StepMessage m;
  m.num_seqs = static_cast<int>(seqs);
  m.max_blocks_per_seq = static_cast<int>(blocks);
  const int32_t* p = payload.data() + kCounts;
  auto take = [&p](std::vector<int32_t>& out, int64_t count) {
    out.assign(p, p + count);
    p += count;
  };
  take(m.tokens, n);
  take(m.positions, n);
  take(m.token_seq, n);
  take(m.block_tables, seqs * blocks);
  take(m.logit_rows, rows);
  for (int64_t r = 0; r < rows; ++r, p += kSamplingInts) {
    model::RowSampling row;
    row.options.temperature = BitsFloat(p[0]);
    row.options.top_k = p[1];
    row.options.top_p = BitsFloat(p[2]);
    row.options.seed = GetU64(p + 3);
    row.draw = GetU64(p + 5);
    if (row.options.top_k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step message: logit row ", r, " has top_k ", row.options.top_k));
    }
    if (!(row.options.top_p > 0.0f && row.options.top_p <= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("step message: logit row ", r, " has top_p ", row.options.top_p));
    }
    m.sampling.push_back(row);
  }
  return m;
}

SlotLimits SlotLimits::For(const model::PagedCacheOptions& cache, int d_model) {
  const int64_t n = cache.max_tokens_per_step, seqs = cache.max_seqs_per_step;
  return SlotLimits{
      .max_payload_ints = kCounts + 3 * n + seqs * cache.num_blocks + seqs * (1 + kSamplingInts),
      .max_residual_floats = n * d_model};
}

namespace {

// The header of `slot`, checked against `limits` on arrival.
absl::Status CheckHeader(const int32_t* header, const SlotLimits& limits, const std::string& where) {
  const int32_t kind = header[0], payload = header[1], residual = header[2];
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a header of kind ", kind,
                                                   ", payload ", payload, " ints and residual ",
                                                   residual, " floats: ", std::string(why)));
  };
  switch (static_cast<StepKind>(kind)) {
    case StepKind::kStep:
    case StepKind::kTokens:
      break;
    case StepKind::kIdle:
    case StepKind::kStop:
      if (payload != 0 || residual != 0) return bad("an idle or stop message carries nothing");
      return absl::OkStatus();
    default:
      return bad("no such kind");
  }
  // Tokens may be none: a step of prompt chunks only samples nothing.
  const int32_t least = kind == static_cast<int32_t>(StepKind::kTokens) ? 0 : 1;
  if (payload < least || payload > limits.max_payload_ints) {
    return bad(absl::StrCat("the payload must be ", least, "..", limits.max_payload_ints));
  }
  if (residual < 0 || residual > limits.max_residual_floats ||
      (kind == static_cast<int32_t>(StepKind::kTokens) && residual != 0)) {
    return bad(absl::StrCat("the residual must be 0..", limits.max_residual_floats,
                            " (0 with tokens)"));
  }
  return absl::OkStatus();
}

void HeaderOf(const Slot& slot, int32_t* header) {
  header[0] = static_cast<int32_t>(slot.kind);
  header[1] = static_cast<int32_t>(slot.payload.size());
  header[2] = static_cast<int32_t>(slot.residual.size());
}

}  // namespace

absl::Status BroadcastSlot(comm::Communicator& tp, Slot& slot, const SlotLimits& limits) {
  int32_t header[kHeaderInts] = {0, 0, 0};
  if (tp.rank() == 0) HeaderOf(slot, header);
  header[2] = 0;  // every rank computes its own residual
  RETURN_IF_ERROR(Annotate(tp.Broadcast(header, kHeaderInts, DType::kInt32, 0),
                           "serving group: broadcast of a message header"));
  if (tp.rank() != 0) {
    RETURN_IF_ERROR(CheckHeader(header, limits, "serving group: from the leader"));
    slot.kind = static_cast<StepKind>(header[0]);
    slot.payload.resize(header[1]);
    slot.residual.clear();
  }
  if (slot.payload.empty()) return absl::OkStatus();
  return Annotate(tp.Broadcast(slot.payload.data(), slot.payload.size(), DType::kInt32, 0),
                  "serving group: broadcast of a message");
}

absl::StatusOr<Slot> TurnRing(comm::Communicator& pp, const Slot& out, const SlotLimits& limits) {
  const int P = pp.size(), stage = pp.rank();
  const int next = (stage + 1) % P, before = (stage + P - 1) % P;
  int32_t header_out[kHeaderInts], header_in[kHeaderInts] = {0, 0, 0};
  HeaderOf(out, header_out);
  RETURN_IF_ERROR(Annotate(pp.SendRecv(header_out, kHeaderInts, next, header_in, kHeaderInts,
                                       before, DType::kInt32),
                           absl::StrCat("serving pipeline: stage ", stage, " passing a header")));
  RETURN_IF_ERROR(
      CheckHeader(header_in, limits, absl::StrCat("serving pipeline: from stage ", before)));
  // One body each way: the payload, then the residual's bits.
  std::vector<int32_t> body_out(out.payload.size() + out.residual.size());
  std::copy(out.payload.begin(), out.payload.end(), body_out.begin());
  if (!out.residual.empty()) {
    std::memcpy(body_out.data() + out.payload.size(), out.residual.data(),
                out.residual.size() * sizeof(float));
  }
  std::vector<int32_t> body_in(static_cast<size_t>(header_in[1]) + header_in[2]);
  RETURN_IF_ERROR(Annotate(pp.SendRecv(body_out.data(), body_out.size(), next, body_in.data(),
                                       body_in.size(), before, DType::kInt32),
                           absl::StrCat("serving pipeline: stage ", stage, " passing a ",
                                        header_out[0] == static_cast<int32_t>(StepKind::kTokens)
                                            ? "token message"
                                            : "step")));
  Slot in;
  in.kind = static_cast<StepKind>(header_in[0]);
  in.payload.assign(body_in.begin(), body_in.begin() + header_in[1]);
  in.residual.resize(header_in[2]);
  if (!in.residual.empty()) {
    std::memcpy(in.residual.data(), body_in.data() + header_in[1],
                in.residual.size() * sizeof(float));
  }
  return in;
}

}  // namespace shardline::serving
