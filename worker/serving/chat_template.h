// A model's own chat template: the Jinja template of a Hugging Face model folder
// (tokenizer_config.json's "chat_template", or chat_template.jinja beside it) that turns chat
// messages into the prompt the model was fine-tuned on, rendered as transformers'
// apply_chat_template renders it.
//
// The engine is Python's jinja2 (Debian's python3-jinja2), embedded through libpython3.11: the
// engine transformers itself renders chat templates with, so a template renders here exactly as
// in transformers (and vLLM), whatever Jinja features it uses. The C++ Jinja engines do not fit:
// Debian 12 packages none, Jinja2Cpp and llama.cpp's minja are on neither Debian 12 nor PyPI, and
// inja (not in Debian 12 either) lacks namespace(), Python's string methods (.strip(),
// .startswith()) and slicing (messages[1:]), which real templates use. The environment is the one
// transformers builds: an ImmutableSandboxedEnvironment (a template cannot change the messages or
// reach Python's internals) with trim_blocks and lstrip_blocks, the loopcontrols extension, the
// {% generation %} block (rendered as its body), raise_exception(message), strftime_now(format),
// and a tojson filter that does not escape HTML and keeps non-ASCII text as it is. The template
// gets `messages` (a list of {"role", "content"}), `add_generation_prompt`, `tools` and `documents`
// (None), and the special tokens the config sets (bos_token, eos_token, unk_token, pad_token, ...).
//
// Python is started (isolated from the environment's PYTHONPATH and PYTHONHOME, without signal
// handlers of its own) by the first template made in a process, and lives until the process ends.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/serving/openai_api.h"

namespace shardline::serving {

// Thread-safe: Render may be called from any thread (renders take turns on Python's lock).
class ChatTemplate {
 public:
  // The template of tokenizer config `config_path` (tokenizer_config.json): chat_template.jinja in
  // the same folder when there is one (it replaces the config's, as in transformers), else the
  // config's "chat_template", a string or a list of {"name", "template"} of which "default" is
  // used. Special tokens are strings or {"content": ...} objects; special_tokens_map.json in the
  // folder gives those the config lacks. NotFound when the folder has no template (the message
  // says so, naming the file); InvalidArgument naming the file for malformed JSON, a template that
  // is not a string, a list without "default", or a template syntax error (with its line);
  // FailedPrecondition when Python's jinja2 cannot be imported.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromTokenizerConfig(
      const std::string& config_path);

  // `source` compiled as a template; `origin` names it in messages ("DIR/tokenizer_config.json").
  // `variables` are the special tokens by name ("bos_token": "<s>"). Errors as above.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(
      const std::string& source, std::map<std::string, std::string> variables, std::string origin);

  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // The prompt for `messages`, ending with the assistant's turn opened when
  // `add_generation_prompt`. InvalidArgument, naming origin(), when the template refuses the
  // messages (raise_exception: its message, whole) or fails on them (the error, with its line in
  // the template).
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const;

  const std::string& origin() const { return origin_; }
  // The special tokens the template sees, by name.
  const std::map<std::string, std::string>& variables() const { return variables_; }

 private:
  ChatTemplate(void* compiled, std::map<std::string, std::string> variables, std::string origin);

  void* compiled_;  // the jinja2 Template (a PyObject*; Python's types stay in the .cc)
  std::map<std::string, std::string> variables_;
  std::string variables_json_;
  std::string origin_;
};

}  // namespace shardline::serving
