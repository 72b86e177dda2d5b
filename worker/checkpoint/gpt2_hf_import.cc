#include "worker/checkpoint/gpt2_hf_import.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/checkpoint/safetensors_reader.h"

namespace shardline::checkpoint {
namespace {

constexpr char kPrefix[] = "transformer.";

// One layer's Hugging Face suffix, our suffix, and whether it is a Conv1D weight to transpose.
struct LayerTensor {
  const char* hf;
  const char* ours;
  bool transpose;
};
constexpr LayerTensor kLayerTensors[] = {
    {"ln_1.weight", "ln1.w", false},
    {"ln_1.bias", "ln1.b", false},
    {"attn.c_attn.weight", "qkv.w", true},
    {"attn.c_attn.bias", "qkv.b", false},
    {"attn.c_proj.weight", "attn_proj.w", true},
    {"attn.c_proj.bias", "attn_proj.b", false},
    {"ln_2.weight", "ln2.w", false},
    {"ln_2.bias", "ln2.b", false},
    {"mlp.c_fc.weight", "fc.w", true},
    {"mlp.c_fc.bias", "fc.b", false},
    {"mlp.c_proj.weight", "fc_proj.w", true},
    {"mlp.c_proj.bias", "fc_proj.b", false},
};

// Parses "h.{i}." at the start of `name`; nullopt when it is not a layer tensor.
std::optional<int64_t> LayerIndex(std::string_view name) {
  if (!name.starts_with("h.")) return std::nullopt;
  int64_t index = -1;
  const char* begin = name.data() + 2;
  const auto [end, error] = std::from_chars(begin, name.data() + name.size(), index);
  if (error != std::errc() || end == begin || *end != '.') return std::nullopt;
  return index;
}

class Importer {
 public:
  Importer(const SafetensorsReader& reader, int64_t n_head)
      : reader_(reader), where_(absl::StrCat("Hugging Face GPT-2 checkpoint ", reader.path())) {
    weights_.config.n_head = n_head;
  }

  absl::StatusOr<Gpt2Weights> Run() {
    RETURN_IF_ERROR(IndexNames());
    ASSIGN_OR_RETURN(HostTensor wte, Take("wte.weight"));
    ASSIGN_OR_RETURN(HostTensor wpe, Take("wpe.weight"));
    RETURN_IF_ERROR(ExpectRank("wte.weight", wte, 2));
    RETURN_IF_ERROR(ExpectRank("wpe.weight", wpe, 2));
    Gpt2Config& config = weights_.config;
    config.vocab_size = wte.shape[0];
    config.n_embd = wte.shape[1];
    config.n_positions = wpe.shape[0];
    RETURN_IF_ERROR(ExpectShape("wpe.weight", wpe, {config.n_positions, config.n_embd}));
    config.n_layer = CountLayers();
    if (config.n_layer == 0) return Error("h.0.ln_1.weight", "is missing (no layers found)");
    // d_ff is read off layer 0's MLP; every layer is then checked against it.
    if (const std::string* name = Lookup("h.0.mlp.c_fc.weight");
        name != nullptr && reader_.Find(*name)->shape.size() == 2) {
      config.d_ff = reader_.Find(*name)->shape[1];
    } else {
      return Error("h.0.mlp.c_fc.weight", "is missing or not 2-d");
    }
    RETURN_IF_ERROR(Annotate(ValidateGpt2Config(config), where_));
    weights_.tensors.emplace("wte", std::move(wte));
    weights_.tensors.emplace("wpe", std::move(wpe));
    for (int64_t l = 0; l < config.n_layer; ++l) RETURN_IF_ERROR(ImportLayer(l));
    RETURN_IF_ERROR(ImportPlain("ln_f.weight", "lnf.w", {config.n_embd}));
    RETURN_IF_ERROR(ImportPlain("ln_f.bias", "lnf.b", {config.n_embd}));
    RETURN_IF_ERROR(CheckTiedHead());
    RETURN_IF_ERROR(CheckNothingLeft());
    return std::move(weights_);
  }

 private:
  // Maps every name, without the optional prefix, to the name in the file.
  absl::Status IndexNames() {
    for (const auto& [name, info] : reader_.tensors()) {
      const std::string_view view = name;
      const std::string_view prefix = kPrefix;
      const std::string bare(view.starts_with(prefix) ? view.substr(prefix.size()) : view);
      if (!names_.emplace(bare, name).second) {
        return absl::InvalidArgumentError(absl::StrCat(where_, ": tensor '", bare,
                                                       "' is present both with and without the '",
                                                       kPrefix, "' prefix"));
      }
    }
    return absl::OkStatus();
  }

  const std::string* Lookup(const std::string& bare) const {
    const auto it = names_.find(bare);
    return it == names_.end() ? nullptr : &it->second;
  }

  absl::Status Error(const std::string& bare, absl::string_view what) const {
    const std::string* name = Lookup(bare);
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": tensor '", name != nullptr ? *name : bare, "' ", what));
  }

  // Reads and converts a tensor, marking it used.
  absl::StatusOr<HostTensor> Take(const std::string& bare) {
    const std::string* name = Lookup(bare);
    if (name == nullptr) return Error(bare, "is missing");
    used_.insert(bare);
    absl::StatusOr<HostTensor> tensor = reader_.ReadFloat(*name);
    if (!tensor.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Hugging Face GPT-2 ", ToString(tensor.status().message())));
    }
    return tensor;
  }

  absl::Status ExpectRank(const std::string& bare, const HostTensor& tensor, size_t rank) const {
    if (tensor.shape.size() == rank) return absl::OkStatus();
    return Error(bare, absl::StrCat("has shape ", ShapeString(tensor.shape), ", expected ", rank,
                                    " dimensions"));
  }

  absl::Status ExpectShape(const std::string& bare, const HostTensor& tensor,
                           const std::vector<int64_t>& shape) const {
    if (tensor.shape == shape) return absl::OkStatus();
    return Error(bare, absl::StrCat("has shape ", ShapeString(tensor.shape), ", expected ",
                                    ShapeString(shape), " from wte/wpe/h.0.mlp.c_fc"));
  }

  // Layers must be numbered 0..n-1; the count is one past the highest index seen, so a gap shows
  // up as a missing tensor of the skipped layer.
  int64_t CountLayers() const {
    int64_t count = 0;
    for (const auto& [bare, name] : names_) {
      if (const std::optional<int64_t> index = LayerIndex(bare))
        count = std::max(count, *index + 1);
    }
    return count;
  }

  absl::Status ImportPlain(const std::string& bare, const std::string& ours,
                           const std::vector<int64_t>& shape) {
    ASSIGN_OR_RETURN(HostTensor tensor, Take(bare));
    RETURN_IF_ERROR(ExpectShape(bare, tensor, shape));
    weights_.tensors.emplace(ours, std::move(tensor));
    return absl::OkStatus();
  }

  absl::Status ImportLayer(int64_t l) {
    // Layer numbering is the same on both sides: "h.{l}." prefixes both names.
    const std::string hf_prefix = absl::StrCat("h.", l, ".");
    const std::vector<Gpt2TensorSpec> specs = Gpt2TensorSpecs(weights_.config);
    for (const LayerTensor& entry : kLayerTensors) {
      const std::string bare = hf_prefix + entry.hf;
      const std::string ours = hf_prefix + entry.ours;
      const auto spec = std::find_if(specs.begin(), specs.end(),
                                     [&](const Gpt2TensorSpec& s) { return s.name == ours; });
      if (!entry.transpose) {
        RETURN_IF_ERROR(ImportPlain(bare, ours, spec->shape));
        continue;
      }
      // Conv1D computes x @ W with W stored (in, out); ours is (out, in) like nn.Linear.
      const int64_t out = spec->shape[0];
      const int64_t in = spec->shape[1];
      ASSIGN_OR_RETURN(HostTensor conv, Take(bare));
      RETURN_IF_ERROR(ExpectShape(bare, conv, {in, out}));
      HostTensor linear;
      linear.shape = {out, in};
      linear.values.resize(conv.values.size());
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t o = 0; o < out; ++o) linear.values[o * in + i] = conv.values[i * out + o];
      }
      weights_.tensors.emplace(ours, std::move(linear));
    }
    // Old exports carry the causal mask as a buffer; it is not a weight.
    for (const char* buffer : {"attn.bias", "attn.masked_bias"}) {
      if (Lookup(hf_prefix + buffer) != nullptr) used_.insert(hf_prefix + buffer);
    }
    return absl::OkStatus();
  }

  // Our format has no head tensor: the head is wte. An untied head cannot be represented, so it
  // is an error rather than silently dropped.
  absl::Status CheckTiedHead() {
    if (Lookup("lm_head.weight") == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(HostTensor head, Take("lm_head.weight"));
    const HostTensor& wte = weights_.tensors.at("wte");
    if (head.shape != wte.shape || std::memcmp(head.values.data(), wte.values.data(),
                                               head.values.size() * sizeof(float)) != 0) {
      return Error("lm_head.weight",
                   "differs from wte.weight; GPT-2 ties them and an untied head is not supported");
    }
    return absl::OkStatus();
  }

  absl::Status CheckNothingLeft() const {
    for (const auto& [bare, name] : names_) {
      if (!used_.contains(bare)) {
        return Error(bare,
                     "is not part of GPT-2 (another architecture, or more layers than "
                     "the numbering says?)");
      }
    }
    return absl::OkStatus();
  }

  const SafetensorsReader& reader_;
  const std::string where_;
  std::map<std::string, std::string> names_;  // bare name -> name in the file
  std::set<std::string> used_;
  Gpt2Weights weights_;
};

}  // namespace

absl::StatusOr<Gpt2Weights> ImportHfGpt2(const std::string& path, int64_t n_head) {
  ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  return Importer(reader, n_head).Run();
}

}  // namespace shardline::checkpoint
