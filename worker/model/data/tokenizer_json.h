// Hugging Face's tokenizer files, read into a BpePipeline (bpe_tokenizer.h): the one place that
// parses a tokenizer.json, and the special tokens of its folder's tokenizer_config.json and
// generation_config.json.
//
// What a tokenizer.json may hold (anything else is refused, naming the file and the field):
//   model          BPE: vocab, merges ("a b" strings or ["a", "b"] pairs), unk_token, fuse_unk,
//                  byte_fallback, ignore_merges (no dropout, continuing_subword_prefix or
//                  end_of_word_suffix)
//   normalizer     Sequence, Prepend, Replace (a String or Regex pattern); null
//   pre_tokenizer  Sequence, Split (String or Regex pattern, any behavior, invert), Metaspace
//                  (replacement, prepend_scheme or the older add_prefix_space, split), ByteLevel
//                  (add_prefix_space, use_regex; only last); null
//   decoder        Sequence, ByteLevel, Metaspace, Replace (a String pattern), ByteFallback, Fuse,
//                  Strip; null
//   added_tokens   special or not, with single_word, lstrip, rstrip and normalized
//   post_processor TemplateProcessing (its "single" template), BertProcessing, RobertaProcessing,
//                  ByteLevel, Sequence of those; null
//   truncation and padding must be null (they would change what one text encodes to).
// Normalizers that need Unicode tables (NFC, NFKC, Lowercase, ...) are among those refused.
//
// Special tokens, from the tokenizer.json's folder:
//   - tokenizer_config.json: bos_token and eos_token (a string, or an object with "content"),
//     add_bos_token and add_eos_token (when present they decide, as transformers'
//     LlamaTokenizerFast does, whether EncodeWithSpecials puts BOS first and EOS last, in place of
//     the post-processor's template);
//   - generation_config.json: eos_token_id (an id or a list: Llama 3 instruct stops on three) and
//     bos_token_id.
// eot() is tokenizer_config's eos_token, else generation_config's first eos_token_id, else an
// added "<|endoftext|>"; stop_tokens() is every eos_token_id of generation_config.json and eot().
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/data/bpe_tokenizer.h"

namespace shardline::data {

// The pipeline of the tokenizer.json at `path`, with the special tokens of the config files beside
// it. NotFound for a missing tokenizer.json; InvalidArgument naming the file and the field (or the
// line, for malformed JSON) for anything that is not a tokenizer this project computes, a token
// the config files name that the tokenizer lacks, an id outside the vocabulary.
absl::StatusOr<BpePipeline> ReadTokenizerJson(const std::string& path);

// BpeTokenizer::Create of ReadTokenizerJson(path).
absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadTokenizerJson(const std::string& path);

}  // namespace shardline::data
