// How a served model makes a prompt of a chat request's messages, decided once when the server
// starts, from the folder of the model's tokenizer (where Hugging Face keeps
// tokenizer_config.json):
//   - the model's own chat template (chat_template.h), when the folder's tokenizer_config.json has
//     a "chat_template" or the folder has chat_template.jinja. The rendered prompt holds the
//     template's special tokens as text (Llama's "<|begin_of_text|>", "<s>"); the tokenizer's
//     Encode matches them as their ids and adds no BOS of its own, so the prompt has exactly the
//     special tokens the template wrote, as transformers' apply_chat_template(tokenize=True) and
//     vLLM give. The request then stops at its own stop strings and the tokenizer's end of text.
//   - refused, every chat request answered with a 400 that names the file, when the folder's
//     tokenizer_config.json has no template: a Hugging Face model without one (GPT-2's own, or a
//     base model), as transformers and vLLM refuse it since they dropped default templates. Its
//     /v1/completions still serves.
//   - the plain "User: …\nAssistant:" form (openai_api.h's ApplyPlainChatForm) for a tokenizer
//     with no tokenizer_config.json: the byte tokenizer of Shardline's own checkpoints (and of the
//     GPT-2 folders `shardline export` writes), or bare GPT-2 vocabulary files, as before
//     templates.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "worker/serving/chat_template.h"
#include "worker/serving/openai_api.h"

namespace shardline::serving {

// Copyable and immutable; Apply may be called from any thread.
class ChatFormat {
 public:
  static ChatFormat PlainText() { return ChatFormat(); }
  static ChatFormat Template(std::shared_ptr<const ChatTemplate> chat_template);
  // Every chat request gets a 400 with `reason`.
  static ChatFormat Refused(std::string reason);

  // Sets params.prompt from params.messages (and, for the plain form, its stop string); else the
  // 400 saying why (a role the plain form lacks, the template's refusal or failure, no template,
  // a template that rendered nothing).
  std::optional<ApiError> Apply(CompletionParams& params) const;

  // For the server's start-up line: "the chat template of DIR/tokenizer_config.json", "the plain
  // User:/Assistant: chat form", "no chat (REASON)".
  std::string Describe() const;

  const ChatTemplate* chat_template() const { return template_.get(); }

 private:
  ChatFormat() = default;

  std::shared_ptr<const ChatTemplate> template_;  // set: the model's template
  std::string refused_;                           // set: no chat, and why
};

// The chat format of a model whose tokenizer is data::LoadTokenizer(`tokenizer_spec`): "bytes", a
// folder, or a file in the folder (training::TokenizerSpecFor's answer). Errors (a broken config
// or template, naming the file; no jinja2) are the caller's to report before serving.
absl::StatusOr<ChatFormat> ChatFormatFor(const std::string& tokenizer_spec);

}  // namespace shardline::serving
