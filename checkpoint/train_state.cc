#include "checkpoint/train_state.h"

#include "absl/strings/str_cat.h"
#include "checkpoint/checksum.h"

namespace shardline::checkpoint {
namespace {

constexpr std::string_view kExpAvgPrefix = "optim.exp_avg.";
constexpr std::string_view kExpAvgSqPrefix = "optim.exp_avg_sq.";

template <typename T>
absl::Status Differs(const std::string& where, const char* key, const T& stored,
                     const T& wanted) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, " is ", stored,
                                                 " in the checkpoint but ", wanted,
                                                 " in the spec; a resumed run must keep it"));
}

std::string DescribeData(const DataIdentity& data) {
  if (data.source == "synthetic") {
    return absl::StrCat("the synthetic corpus (seed ", data.synthetic_seed, ", ",
                        data.synthetic_bytes, " bytes)");
  }
  return absl::StrCat("the file ", data.path.empty() ? "(unnamed)" : data.path);
}

}  // namespace

std::string StateTensorName(StateKind kind, std::string_view param) {
  switch (kind) {
    case StateKind::kParam:
      return std::string(param);
    case StateKind::kExpAvg:
      return std::string(kExpAvgPrefix).append(param);
    case StateKind::kExpAvgSq:
      return std::string(kExpAvgSqPrefix).append(param);
  }
  return std::string(param);
}

StateTensor ParseStateTensorName(std::string_view name) {
  if (name.starts_with(kExpAvgSqPrefix)) {
    return {StateKind::kExpAvgSq, std::string(name.substr(kExpAvgSqPrefix.size()))};
  }
  if (name.starts_with(kExpAvgPrefix)) {
    return {StateKind::kExpAvg, std::string(name.substr(kExpAvgPrefix.size()))};
  }
  return {StateKind::kParam, std::string(name)};
}

std::string PlanSummary(const PlanInfo& plan) {
  std::string schedule;
  if (plan.schedule != "1f1b") {
    schedule = absl::StrCat(" · ", plan.schedule, " ×", plan.virtual_stages);
  }
  const std::string recompute =
      plan.recompute != "none" ? absl::StrCat(" · recompute ", plan.recompute) : std::string();
  return absl::StrCat("tp ", plan.tp, " · pp ", plan.pp, " · dp ", plan.dp, " · ZeRO ", plan.zero,
                      schedule, recompute, " (", plan.device, ", ", plan.precision, ")");
}

absl::Status CheckSameModel(const Gpt2Config& stored, const Gpt2Config& config,
                            const std::string& where) {
  // The spec's keys, in the order a spec lists them.
  const struct {
    const char* key;
    int64_t Gpt2Config::*field;
  } kFields[] = {{"model.layers", &Gpt2Config::n_layer},    {"model.heads", &Gpt2Config::n_head},
                 {"model.d_model", &Gpt2Config::n_embd},    {"model.d_ff", &Gpt2Config::d_ff},
                 {"model.vocab", &Gpt2Config::vocab_size},
                 {"model.max_seq_len", &Gpt2Config::n_positions}};
  for (const auto& f : kFields) {
    if (stored.*f.field != config.*f.field) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", f.key, " is ", stored.*f.field,
                                                     " in the checkpoint but ", config.*f.field,
                                                     " in the spec"));
    }
  }
  if (stored.tied_embeddings != config.tied_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": model.tied_embeddings is ", stored.tied_embeddings ? "true" : "false",
                     " in the checkpoint but ", config.tied_embeddings ? "true" : "false",
                     " in the spec"));
  }
  return absl::OkStatus();
}

absl::Status CheckResumable(const Gpt2Config& stored_config, const TrainState& stored_train,
                            const Gpt2Config& config, const TrainState& train,
                            const std::string& where) {
  if (absl::Status same = CheckSameModel(stored_config, config, where); !same.ok()) return same;
  if (stored_train.seed != train.seed) return Differs(where, "seed", stored_train.seed, train.seed);
  if (stored_train.batch != train.batch) {
    return Differs(where, "batch", stored_train.batch, train.batch);
  }
  if (stored_train.seq_len != train.seq_len) {
    return Differs(where, "seq_len", stored_train.seq_len, train.seq_len);
  }
  const DataIdentity& a = stored_train.data;
  const DataIdentity& b = train.data;
  const bool same_source =
      a.source == b.source && (a.source != "synthetic" || (a.synthetic_seed == b.synthetic_seed &&
                                                            a.synthetic_bytes == b.synthetic_bytes));
  if (!same_source) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": data is ", DescribeData(a),
                                                   " in the checkpoint but ", DescribeData(b),
                                                   " in the spec; a resumed run must keep it"));
  }
  return CheckSameTokens(a, b, where);
}

absl::Status CheckSameTokens(const DataIdentity& stored, const DataIdentity& actual,
                             const std::string& where) {
  if (stored.tokens == 0 || actual.tokens == 0) return absl::OkStatus();
  if (stored.tokens == actual.tokens && stored.xxh3 == actual.xxh3) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": data is not the token stream the checkpoint was trained on: ", stored.tokens,
      " tokens with checksum ", ChecksumHex(stored.xxh3), " then, ", actual.tokens,
      " tokens with checksum ", ChecksumHex(actual.xxh3), " now (", DescribeData(actual),
      "); a resumed run must keep its data"));
}

}  // namespace shardline::checkpoint
