// Writes a model as a Hugging Face GPT-2 folder (model.safetensors + config.json) that
// `transformers.GPT2LMHeadModel.from_pretrained(DIR)` loads as it is, and that ImportHfGpt2 (and so
// every Shardline loader) reads back bit-exact. docs/checkpoint-format.md gives the mapping.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "checkpoint/file_system.h"
#include "checkpoint/gpt2_checkpoint.h"

namespace shardline::checkpoint {

// Writes out_dir/model.safetensors and out_dir/config.json (each atomically, model first),
// creating out_dir. Tensor names are save_pretrained's ("transformer.h.0.attn.c_attn.weight"),
// F32, with `__metadata__` {"format": "pt"} (transformers refuses a file without it); the four
// Conv1D weights of each layer are transposed back to Hugging Face's (in, out). A tied head is not
// stored (tie_word_embeddings true); an untied one is "lm_head.weight" with tie_word_embeddings
// false. config.json states every setting our model computes with (gelu_new, LayerNorm eps 1e-5,
// no dropout) rather than leaving it to GPT2Config's defaults.
//
// InvalidArgument, naming out_dir and the tensor, for an invalid config or a tensor of `weights`
// that is missing, has the wrong shape or is not part of a GPT-2 of its config; file system errors
// name the file.
absl::Status ExportHfGpt2(const Gpt2Weights& weights, const std::string& out_dir,
                          FileSystem& fs = DefaultFileSystem());

}  // namespace shardline::checkpoint
