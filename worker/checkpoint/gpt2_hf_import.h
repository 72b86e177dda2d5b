// Loads a Hugging Face GPT-2 safetensors checkpoint (model.safetensors of "gpt2", "gpt2-medium",
// ... or a GPT2LMHeadModel saved with save_pretrained) into our names and layout, so that real
// GPT-2 weights run on Shardline. docs/checkpoint-format.md gives the mapping.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/checkpoint/gpt2_checkpoint.h"

namespace shardline::checkpoint {

// Reads `path`, accepting names with or without the "transformer." prefix. HF's Conv1D weights
// are stored (in, out); they are transposed into our (out, in). An "lm_head.weight" must equal
// wte (GPT-2 ties them); the attention-mask buffers "h.{i}.attn.bias" / "attn.masked_bias" that
// old exports carry are skipped. F16/BF16/F64 weights are widened to fp32.
//
// The config is inferred from the shapes (layers, n_embd, d_ff, vocab, n_positions) except the
// head count, which no tensor shows: pass it (12 for the 124M "gpt2").
//
// InvalidArgument, naming the file and the Hugging Face tensor name, for a missing tensor, a shape
// that disagrees with the others, a non-float dtype, an untied head or an unexpected tensor.
absl::StatusOr<Gpt2Weights> ImportHfGpt2(const std::string& path, int64_t n_head = 12);

}  // namespace shardline::checkpoint
