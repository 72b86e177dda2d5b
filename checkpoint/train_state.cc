#include "checkpoint/train_state.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/checksum.h"

namespace shardline::checkpoint {
namespace {

// Every kind but kParam, by its name's prefix; a longer prefix before one it starts with.
constexpr std::pair<StateKind, std::string_view> kPrefixes[] = {
    {StateKind::kExpAvgSq, "optim.exp_avg_sq."},
    {StateKind::kExpAvg, "optim.exp_avg."},
    {StateKind::kOuterAnchor, "outer.anchor."},
    {StateKind::kOuterMomentum, "outer.momentum."},
    {StateKind::kSiteExpAvgSq, "site.optim.exp_avg_sq."},
    {StateKind::kSiteExpAvg, "site.optim.exp_avg."},
    {StateKind::kSiteParam, "site."},
    {StateKind::kCarriedError, "dp.carried_error."},
    {StateKind::kServerError, "dp.server_error."},
};

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
  if (data.source == "per_site") return absl::StrCat("each site's own file (", data.path, ")");
  return absl::StrCat("the file ", data.path.empty() ? "(unnamed)" : data.path);
}

}  // namespace

bool IsPerSite(StateKind kind) {
  return kind == StateKind::kSiteParam || kind == StateKind::kSiteExpAvg ||
         kind == StateKind::kSiteExpAvgSq || kind == StateKind::kCarriedError ||
         kind == StateKind::kServerError;
}

bool IsStrategyState(StateKind kind) {
  return kind != StateKind::kParam && kind != StateKind::kExpAvg && kind != StateKind::kExpAvgSq;
}

std::string StateTensorName(StateKind kind, std::string_view param) {
  for (const auto& [k, prefix] : kPrefixes) {
    if (k == kind) return std::string(prefix).append(param);
  }
  return std::string(param);
}

StateTensor ParseStateTensorName(std::string_view name) {
  for (const auto& [kind, prefix] : kPrefixes) {
    if (name.starts_with(prefix)) return {kind, std::string(name.substr(prefix.size()))};
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

absl::Status CheckSameModel(const model::ModelConfig& stored, const model::ModelConfig& config,
                            const std::string& where) {
  // The spec's keys, in the order a spec lists them; widths resolved (d_ff 0 is 4·d_model).
  const struct {
    const char* key;
    int64_t stored, spec;
  } kSizes[] = {{"model.layers", stored.layers, config.layers},
                {"model.heads", stored.heads, config.heads},
                {"model.kv_heads", stored.kv(), config.kv()},
                {"model.d_model", stored.d_model, config.d_model},
                {"model.d_ff", stored.ff(), config.ff()},
                {"model.vocab", stored.vocab, config.vocab},
                {"model.max_seq_len", stored.max_seq_len, config.max_seq_len}};
  for (const auto& f : kSizes) {
    if (f.stored != f.spec) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", f.key, " is ", f.stored, " in the checkpoint but ", f.spec, " in the spec"));
    }
  }
  const auto differs = [&](const char* key, std::string_view in_checkpoint,
                           std::string_view in_spec) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", key, " is ", std::string(in_checkpoint),
                     " in the checkpoint but ", std::string(in_spec), " in the spec"));
  };
  const auto boolean = [](bool b) { return b ? "true" : "false"; };
  if (stored.tied_embeddings != config.tied_embeddings) {
    return differs("model.tied_embeddings", boolean(stored.tied_embeddings),
                   boolean(config.tied_embeddings));
  }
  // The family's choices, which a spec sets through `arch`.
  if (stored.norm != config.norm) {
    return differs("model.arch (norm)", model::NormKindName(stored.norm),
                   model::NormKindName(config.norm));
  }
  if (stored.mlp != config.mlp) {
    return differs("model.arch (mlp)", model::MlpKindName(stored.mlp),
                   model::MlpKindName(config.mlp));
  }
  if (stored.positions != config.positions) {
    return differs("model.arch (positions)", model::PositionKindName(stored.positions),
                   model::PositionKindName(config.positions));
  }
  if (stored.bias != config.bias) {
    return differs("model.arch (bias)", boolean(stored.bias), boolean(config.bias));
  }
  if (stored.norm_eps != config.norm_eps) {
    return differs("model.norm_eps", absl::StrCat(stored.norm_eps), absl::StrCat(config.norm_eps));
  }
  if (stored.positions == model::PositionKind::kRotary && stored.rope_theta != config.rope_theta) {
    return differs("model.rope_theta", absl::StrCat(stored.rope_theta),
                   absl::StrCat(config.rope_theta));
  }
  return absl::OkStatus();
}

absl::Status CheckResumable(const model::ModelConfig& stored_config, const TrainState& stored_train,
                            const model::ModelConfig& config, const TrainState& train,
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
