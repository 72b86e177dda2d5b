#include "worker/serving/chat_format.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardline::serving {

ChatFormat ChatFormat::Template(std::shared_ptr<const ChatTemplate> chat_template) {
  ChatFormat f;
  f.template_ = std::move(chat_template);
  return f;
}

ChatFormat ChatFormat::Refused(std::string reason) {
  ChatFormat f;
  f.refused_ = std::move(reason);
  return f;
}

std::optional<ApiError> ChatFormat::Apply(CompletionParams& params) const {
  if (!refused_.empty()) {
    return MakeApiError(400, refused_, "invalid_request_error", "messages",
                        "chat_template_missing");
  }
  if (template_ == nullptr) return ApplyPlainChatForm(params);
  absl::StatusOr<std::string> prompt =
      template_->Render(params.messages, /*add_generation_prompt=*/true);
  if (!prompt.ok()) {
    return MakeApiError(400, std::string(prompt.status().message()), "invalid_request_error",
                        "messages");
  }
  if (prompt->empty()) {
    return MakeApiError(400,
                        absl::StrCat("the chat template (", template_->origin(),
                                     ") rendered these messages as an empty prompt"),
                        "invalid_request_error", "messages");
  }
  params.prompt = std::move(*prompt);
  return std::nullopt;
}

std::string ChatFormat::Describe() const {
  if (!refused_.empty()) return absl::StrCat("no chat (", refused_, ")");
  if (template_ != nullptr) return absl::StrCat("the chat template of ", template_->origin());
  return "the plain User:/Assistant: chat form";
}

absl::StatusOr<ChatFormat> ChatFormatFor(const std::string& tokenizer_spec) {
  namespace fs = std::filesystem;
  if (tokenizer_spec == "bytes") return ChatFormat::PlainText();
  std::error_code ec;
  std::string dir = fs::is_directory(tokenizer_spec, ec)
                        ? tokenizer_spec
                        : fs::path(tokenizer_spec).parent_path().string();
  if (dir.empty()) dir = ".";
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  const bool has_config = fs::exists(config, ec);
  const bool has_jinja = fs::exists(fs::path(dir) / "chat_template.jinja", ec);
  if (!has_config && !has_jinja) return ChatFormat::PlainText();
  if (!has_config) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir,
                     " has chat_template.jinja but no tokenizer_config.json beside it (with "
                     "the special tokens the template uses)"));
  }
  absl::StatusOr<std::unique_ptr<ChatTemplate>> loaded =
      ChatTemplate::FromTokenizerConfig(config.string());
  if (absl::IsNotFound(loaded.status())) {
    return ChatFormat::Refused(
        absl::StrCat("this model has no chat template: ", loaded.status().message(),
                     "; chat completions need one (/v1/completions "
                     "takes a prompt of your own)"));
  }
  if (!loaded.ok()) return loaded.status();
  return ChatFormat::Template(std::shared_ptr<const ChatTemplate>(std::move(*loaded)));
}

}  // namespace shardline::serving
