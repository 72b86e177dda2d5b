#include "checkpoint/gpt2_hf_export.h"

#include <filesystem>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/gpt2_hf_import.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors_writer.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"

namespace shardline::checkpoint {
namespace {

namespace stdfs = std::filesystem;

// kernels/cpu/layernorm.h's kLayerNormEps; checkpoint/ may not include kernels/, so the export
// test holds the two equal.

// The end-of-text token of the tokenizers whose vocabularies we know by size: the byte
// tokenizer's (worker/model/data/byte_tokenizer.h, 257 tokens) and GPT-2's BPE (50257); null for
// any other, where GPT2Config's default 50256 would be a guess.
nlohmann::json EndOfTextToken(int64_t vocab_size) {
  if (vocab_size == 257) return 256;
  if (vocab_size == 50257) return 50256;
  return nullptr;
}

// What GPT2Config reads, with every setting our model computes with spelled out, so that a
// later change of transformers' defaults cannot change what the file means.
std::string HfConfigJson(const model::ModelConfig& config) {
  const nlohmann::json json = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", config.vocab},
      {"n_positions", config.max_seq_len},
      {"n_ctx", config.max_seq_len},  // the legacy name old loaders read
      {"n_embd", config.d_model},
      {"n_layer", config.layers},
      {"n_head", config.heads},
      {"n_inner", config.ff()},
      {"activation_function", "gelu_new"},  // the tanh GELU of kernels/cpu/elementwise.cc
      {"layer_norm_epsilon", config.norm_eps},
      {"resid_pdrop", 0.0},  // our training uses no dropout
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", config.tied_embeddings},
      {"bos_token_id", EndOfTextToken(config.vocab)},
      {"eos_token_id", EndOfTextToken(config.vocab)},
      {"use_cache", true},
      {"torch_dtype", "float32"},
  };
  return json.dump(2) + "\n";
}

// Conv1D stores (in, out) what we store (out, in).
std::vector<float> Transposed(const HostTensor& linear) {
  const int64_t out = linear.shape[0];
  const int64_t in = linear.shape[1];
  std::vector<float> conv(linear.values.size());
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) conv[i * out + o] = linear.values[o * in + i];
  }
  return conv;
}

}  // namespace

absl::Status ExportHfGpt2(const Gpt2Weights& weights, const std::string& out_dir, FileSystem& fs) {
  const std::string where = absl::StrCat("exporting Hugging Face GPT-2 to ", out_dir);
  RETURN_IF_ERROR(Annotate(ValidateHfGpt2Config(weights.config), where));
  RETURN_IF_ERROR(CheckHoldsExactlyItsTensors(weights, where, "GPT-2"));

  // (our name, the Hugging Face name without the prefix): copied as they are, and transposed.
  std::vector<std::pair<std::string, std::string>> plain = {{"wte", "wte.weight"},
                                                            {"wpe", "wpe.weight"},
                                                            {"lnf.w", "ln_f.weight"},
                                                            {"lnf.b", "ln_f.bias"}};
  std::vector<std::pair<std::string, std::string>> conv;
  for (int64_t l = 0; l < weights.config.layers; ++l) {
    const std::string h = absl::StrCat("h.", l, ".");
    for (const HfGpt2LayerTensor& entry : HfGpt2LayerTensors()) {
      (entry.transpose ? conv : plain).emplace_back(h + entry.ours, h + entry.hf);
    }
  }

  RETURN_IF_ERROR(fs.CreateDirectories(out_dir));
  SafetensorsWriter writer((stdfs::path(out_dir) / kModelFileName).string());
  // transformers refuses a safetensors file whose metadata does not name its framework.
  writer.SetMetadata("format", "pt");
  const std::string prefix(kHfGpt2Prefix);
  for (const auto& [ours, hf] : plain) {
    RETURN_IF_ERROR(writer.Add(weights.tensors.at(ours).View(prefix + hf)));
  }
  // The transposed copies must outlive writer.Finish(), which reads them.
  std::vector<HostTensor> transposed;
  transposed.reserve(conv.size());
  for (const auto& [ours, hf] : conv) {
    const HostTensor& linear = weights.tensors.at(ours);
    transposed.push_back({{linear.shape[1], linear.shape[0]}, Transposed(linear)});
    RETURN_IF_ERROR(writer.Add(transposed.back().View(prefix + hf)));
  }
  // GPT2LMHeadModel's own module, outside the transformer.
  if (!weights.config.tied_embeddings) {
    RETURN_IF_ERROR(writer.Add(weights.tensors.at("lm_head.w").View("lm_head.weight")));
  }
  RETURN_IF_ERROR(writer.Finish(fs).status());
  return WriteFileAtomically(fs, (stdfs::path(out_dir) / kHfConfigFileName).string(),
                             HfConfigJson(weights.config));
}

}  // namespace shardline::checkpoint
