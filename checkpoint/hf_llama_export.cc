#include "checkpoint/hf_llama_export.h"

#include <filesystem>
#include <set>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors_writer.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"

namespace shardline::checkpoint {
namespace {

namespace stdfs = std::filesystem;

// The end-of-text token of the byte tokenizer (worker/model/data/byte_tokenizer.h, 257 tokens),
// the one vocabulary we know by its size; null for any other, where LlamaConfig's defaults (1, 2)
// would be a guess.
nlohmann::json EndOfTextToken(int64_t vocab_size) {
  if (vocab_size == 257) return 256;
  return nullptr;
}

// What LlamaConfig reads (transformers 4's form, which transformers 5 converts on loading), with
// every setting our model computes with spelled out.
std::string HfConfigJson(const model::ModelConfig& config) {
  nlohmann::json rope_scaling = nullptr;
  if (config.rope_scaling.enabled()) {
    const model::RopeScaling& rope = config.rope_scaling;
    rope_scaling = {{"rope_type", "llama3"},
                    {"factor", rope.factor},
                    {"low_freq_factor", rope.low_freq_factor},
                    {"high_freq_factor", rope.high_freq_factor},
                    {"original_max_position_embeddings", rope.original_max_positions}};
  }
  const nlohmann::json json = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", config.vocab},
      {"hidden_size", config.d_model},
      {"intermediate_size", config.ff()},
      {"num_hidden_layers", config.layers},
      {"num_attention_heads", config.heads},
      {"num_key_value_heads", config.kv()},
      {"head_dim", config.head_size()},
      {"max_position_embeddings", config.max_seq_len},
      {"hidden_act", "silu"},
      {"rms_norm_eps", config.norm_eps},
      {"rope_theta", config.rope_theta},
      {"rope_scaling", rope_scaling},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attention_dropout", 0.0},  // our training uses no dropout
      {"pretraining_tp", 1},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", config.tied_embeddings},
      {"bos_token_id", EndOfTextToken(config.vocab)},
      {"eos_token_id", EndOfTextToken(config.vocab)},
      {"use_cache", true},
      {"torch_dtype", "float32"},
  };
  return json.dump(2) + "\n";
}

}  // namespace

absl::Status ExportHfLlama(const Gpt2Weights& weights, const std::string& out_dir, FileSystem& fs) {
  const std::string where = absl::StrCat("exporting Hugging Face Llama to ", out_dir);
  const model::ModelConfig& config = weights.config;
  RETURN_IF_ERROR(Annotate(config.Validate(), where));
  RETURN_IF_ERROR(Annotate(CheckLlamaChoices(config), where));
  RETURN_IF_ERROR(CheckHoldsExactlyItsTensors(weights, where, "Llama"));

  RETURN_IF_ERROR(fs.CreateDirectories(out_dir));
  SafetensorsWriter writer((stdfs::path(out_dir) / kModelFileName).string());
  // transformers refuses a safetensors file whose metadata does not name its framework.
  writer.SetMetadata("format", "pt");
  for (const auto& [ours, pieces] : HfLlamaTensorMap(config)) {
    const std::span<const float> values = weights.tensors.at(ours).values;
    for (const HfPiece& piece : pieces) {
      // Each piece is a slab of dimension 0 of our box view, whole in the others: one contiguous
      // run of our tensor's elements.
      int64_t slab = 1;
      for (size_t d = 1; d < piece.shape.size(); ++d) slab *= piece.shape[d];
      const std::span<const float> run =
          values.subspan(static_cast<size_t>(piece.offsets.empty() ? 0 : piece.offsets[0] * slab),
                         *NumElements(piece.hf_shape));
      RETURN_IF_ERROR(writer.Add(
          TensorView{piece.hf_name, SafetensorsDType::kF32, piece.hf_shape, std::as_bytes(run)}));
    }
  }
  RETURN_IF_ERROR(writer.Finish(fs).status());
  return WriteFileAtomically(fs, (stdfs::path(out_dir) / kHfConfigFileName).string(),
                             HfConfigJson(config));
}

}  // namespace shardline::checkpoint
