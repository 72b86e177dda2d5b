// worker/serving/chat_template.h and chat_format.h: real models' chat templates
// (tests/unit/chat_templates/, README.md there names each) rendered to the strings their models
// expect, the same as transformers' way of rendering them (serving_chat_template_reference.py,
// with /usr/bin/python3 and Debian's python3-jinja2), the Jinja features templates use, and the
// errors: a syntax error naming the file and line, raise_exception's message, no template.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "nlohmann/json.hpp"
#include "tests/support/cli_process.h"
#include "worker/serving/chat_format.h"
#include "worker/serving/chat_template.h"

namespace shardline::serving {
namespace {

using ::nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";

std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_PATH;
}

std::string Fixture(const std::string& name) {
  return SourceDir() + "/tests/unit/chat_templates/" + name + "/tokenizer_config.json";
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::unique_ptr<ChatTemplate> Load(const std::string& config_path) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromTokenizerConfig(config_path);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::string Render(const std::string& fixture, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt = true) {
  std::unique_ptr<ChatTemplate> t = Load(Fixture(fixture));
  if (t == nullptr) return "<no template>";
  absl::StatusOr<std::string> text = t->Render(messages, add_generation_prompt);
  EXPECT_TRUE(text.ok()) << fixture << ": " << text.status();
  return text.value_or("<error>");
}

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi there! "}, {"assistant", " Hello."}, {"user", "Again"}};

TEST(ChatTemplateTest, Llama3) {
  EXPECT_EQ(Render("llama3", kConversation),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nAgain<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render("llama3", {{"user", "Hi"}}, /*add_generation_prompt=*/false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplateTest, Llama32WritesTodaysDate) {
  // strftime_now("%d %b %Y"), as transformers gives it: the local date.
  char today[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(today, sizeof(today), "%d %b %Y", &local);
  EXPECT_EQ(Render("llama32", kConversation),
            std::string("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                        "Cutting Knowledge Date: December 2023\nToday Date: ") +
                today +
                "\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nAgain<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Llama2AndItsRoleOrder) {
  EXPECT_EQ(Render("llama2", kConversation),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi there! [/INST] Hello. </s>"
            "<s>[INST] Again [/INST]");
  std::unique_ptr<ChatTemplate> t = Load(Fixture("llama2"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->variables().at("bos_token"), "<s>") << "an AddedToken object's content";
  EXPECT_EQ(t->variables().count("pad_token"), 0u) << "null: left out";
  const absl::StatusOr<std::string> refused =
      t->Render({{"user", "a"}, {"user", "b"}}, /*add_generation_prompt=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(refused.status()),
              AllOf(HasSubstr(Fixture("llama2")), HasSubstr("refused the messages: Conversation "
                                                            "roles must alternate "
                                                            "user/assistant/user/assistant/...")));
}

TEST(ChatTemplateTest, TinyLlamaNeedsTrimBlocks) {
  EXPECT_EQ(Render("tinyllama", kConversation),
            "<|system|>\nBe brief.</s>\n<|user|>\nHi there! </s>\n<|assistant|>\n Hello.</s>\n"
            "<|user|>\nAgain</s>\n<|assistant|>\n");
}

TEST(ChatTemplateTest, ChatMLWithAndWithoutASystemMessage) {
  EXPECT_EQ(Render("chatml", kConversation),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there! <|im_end|>\n"
            "<|im_start|>assistant\n Hello.<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(Render("chatml", {{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Render("qwen25", {{"user", "Hi"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, MistralAndItsNamespaceCheck) {
  EXPECT_EQ(Render("mistral", {{"user", "Hi"}, {"assistant", "Hello."}, {"user", "Again"}}),
            "<s>[INST] Hi [/INST]Hello.</s>[INST] Again [/INST]");
  EXPECT_EQ(Render("mistral_v03", kConversation),
            "<s>[INST] Hi there! [/INST] Hello.</s>[INST] Be brief.\n\nAgain[/INST]");
  for (const char* fixture : {"mistral", "mistral_v03"}) {
    std::unique_ptr<ChatTemplate> t = Load(Fixture(fixture));
    ASSERT_NE(t, nullptr);
    const absl::StatusOr<std::string> refused =
        t->Render({{"assistant", "a"}, {"user", "b"}}, /*add_generation_prompt=*/true);
    EXPECT_THAT(Message(refused.status()), HasSubstr("roles must alternate")) << fixture;
  }
}

// What transformers' environment has beyond plain Jinja, and what templates lean on.
TEST(ChatTemplateTest, JinjaFeaturesThatTemplatesUse) {
  const std::string source =
      "{%- set ns = namespace(n=0, sys='') -%}\n"
      "{%- for m in messages -%}\n"
      "  {%- if m.role == 'system' %}{% set ns.sys = m.content %}{% continue %}{% endif -%}\n"
      "  {%- if m.content.startswith('STOP') %}{% break %}{% endif -%}\n"
      "  {%- set ns.n = ns.n + 1 -%}\n"
      "  [{{ loop.index0 }}{{ '*' if loop.first }}{{ '$' if loop.last }}]"
      "{% generation %}{{ m.content | trim | upper }}{% endgeneration %}\n"
      "{%- endfor -%}\n"
      "|{{ ns.n }}|{{ ns.sys ~ '!' }}|{{ messages | length }}|{{ messages[1:] | length }}"
      "|{{ messages[0] | tojson }}|{{ {'a': 1} | tojson(indent=2) }}"
      "|{{ tools is none }}|{{ documents is none }}|{{ eos_token }}|{{ add_generation_prompt }}";
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      ChatTemplate::Create(source, {{"eos_token", "</s>"}}, "features");
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<std::string> text = (*t)->Render(
      {{"system", "sé <b>&</b>"}, {"user", " hi "}, {"user", "yo"}, {"user", "STOP now"}},
      /*add_generation_prompt=*/false);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "[1]HI[2]YO|2|sé <b>&</b>!|4|3"
            "|{\"role\": \"system\", \"content\": \"sé <b>&</b>\"}|{\n  \"a\": 1\n}"
            "|True|True|</s>|False")
      << "tojson keeps non-ASCII text and does not escape HTML, as transformers' does";
}

TEST(ChatTemplateTest, TheSandboxKeepsTemplatesFromPython) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Create(
      "{{ messages.__class__.__mro__ }}{{ messages.append(1) }}", {}, "unsafe");
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::StatusOr<std::string> text = (*t)->Render({{"user", "x"}}, true);
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(Message(text.status()), AllOf(HasSubstr("unsafe"), HasSubstr("SecurityError")));
}

TEST(ChatTemplateTest, ASyntaxErrorNamesTheFileAndLine) {
  const std::string dir = test_support::MakeTestDir("chat_template");
  WriteFile(
      dir + "/tokenizer_config.json",
      json{{"chat_template", "{% for m in messages %}\n{{ m.content }\n{% endfor %}"}}.dump());
  const auto t = ChatTemplate::FromTokenizerConfig(dir + "/tokenizer_config.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(t.status()),
              AllOf(HasSubstr(dir + "/tokenizer_config.json: the chat template is not valid Jinja: "
                                    "line 2:"),
                    HasSubstr("'}'")));
}

TEST(ChatTemplateTest, AFailureWhileRenderingSaysWhereInTheTemplate) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      ChatTemplate::Create("line 1\n{{ messages[0].content + 1 }}", {}, "typed");
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::StatusOr<std::string> text = (*t)->Render({{"user", "x"}}, true);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(text.status()),
              AllOf(HasSubstr("rendering the chat template (typed) failed: TypeError"),
                    HasSubstr("line 2 of the template")));
}

TEST(ChatTemplateTest, NamedTemplatesJinjaFilesAndSpecialTokensMap) {
  const std::string dir = test_support::MakeTestDir("chat_template");
  const std::string config = dir + "/tokenizer_config.json";
  WriteFile(config, json{{"chat_template",
                          json::array({{{"name", "tool_use"}, {"template", "T"}},
                                       {{"name", "default"}, {"template", "D{{ bos_token }}"}}})},
                         {"bos_token", "<s>"}}
                        .dump());
  std::unique_ptr<ChatTemplate> t = Load(config);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Render({{"user", "x"}}, true).value_or(""), "D<s>") << "the 'default' of a list";

  WriteFile(config, json{{"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                        {{"name", "rag"}, {"template", "R"}}})}}
                        .dump());
  const auto no_default = ChatTemplate::FromTokenizerConfig(config);
  EXPECT_THAT(Message(no_default.status()),
              AllOf(HasSubstr(config), HasSubstr("named 'tool_use', 'rag' but none named "
                                                 "'default'")));

  // chat_template.jinja replaces the config's, as in transformers; special_tokens_map.json gives
  // the tokens the config lacks.
  WriteFile(config, json{{"chat_template", "config's"}, {"eos_token", nullptr}}.dump());
  WriteFile(dir + "/chat_template.jinja", "jinja's {{ bos_token }}{{ eos_token }}\n");
  WriteFile(dir + "/special_tokens_map.json",
            json{{"bos_token", {{"content", "<B>"}}}, {"eos_token", "<E>"}}.dump());
  t = Load(config);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->origin(), dir + "/chat_template.jinja");
  EXPECT_EQ(t->Render({{"user", "x"}}, true).value_or(""), "jinja's <B><E>");

  WriteFile(config, json{{"chat_template", "x"}, {"bos_token", 5}}.dump());
  std::filesystem::remove(dir + "/chat_template.jinja");
  EXPECT_THAT(Message(ChatTemplate::FromTokenizerConfig(config).status()),
              AllOf(HasSubstr(config), HasSubstr("\"bos_token\" must be a string")));
  WriteFile(config, "{\"chat_template\": ");
  EXPECT_THAT(Message(ChatTemplate::FromTokenizerConfig(config).status()),
              AllOf(HasSubstr(config), HasSubstr("not valid JSON")));
  WriteFile(config, json{{"model_max_length", 1024}}.dump());
  const auto none = ChatTemplate::FromTokenizerConfig(config);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(none.status()), AllOf(HasSubstr(config), HasSubstr("no \"chat_template\"")));
}

TEST(ChatTemplateTest, RendersFromManyThreadsAtOnce) {
  std::unique_ptr<ChatTemplate> t = Load(Fixture("llama3"));
  ASSERT_NE(t, nullptr);
  const std::string expected = t->Render(kConversation, true).value_or("");
  ASSERT_FALSE(expected.empty());
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 50; ++k) {
        if (t->Render(kConversation, true).value_or("") != expected) ++wrong;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Every fixture over several conversations, here and in transformers' environment.
TEST(ChatTemplateTest, RendersAsTransformersDoes) {
  const std::vector<std::string> fixtures = {"llama3", "llama32", "llama2",      "tinyllama",
                                             "chatml", "mistral", "mistral_v03", "qwen25"};
  const std::vector<std::vector<ChatMessage>> conversations = {
      {{"user", "Hello"}},
      kConversation,
      {{"user", "Hi"},
       {"assistant", "Hello."},
       {"user", "Ünïcödé 🙂 \"quoted\" \\ <tag>\n\nend"}},
      {{"system", "  spaced  "}, {"user", "{{ not a template }} {% raw %}"}},
      {{"user", "a"}, {"user", "b"}},  // refused by the templates that check the order
  };
  const std::string dir = test_support::MakeTestDir("chat_template_reference");
  json cases = json::array();
  for (const std::string& fixture : fixtures) {
    for (const auto& messages : conversations) {
      for (const bool add : {true, false}) {
        json list = json::array();
        for (const ChatMessage& m : messages)
          list.push_back({{"role", m.role}, {"content", m.content}});
        cases.push_back(
            {{"config", Fixture(fixture)}, {"messages", list}, {"add_generation_prompt", add}});
      }
    }
  }
  WriteFile(dir + "/cases.json", cases.dump());
  SpawnOptions spawn;
  spawn.argv = {kPython, SourceDir() + "/tests/unit/serving_chat_template_reference.py",
                dir + "/cases.json", dir + "/out.json"};
  spawn.log_path = dir + "/python.log";
  absl::StatusOr<pid_t> pid = Spawn(spawn);
  ASSERT_TRUE(pid.ok()) << pid.status();
  absl::StatusOr<std::optional<ExitStatus>> exit = WaitFor(*pid, std::chrono::seconds(60));
  ASSERT_TRUE(exit.ok() && exit->has_value()) << "the reference did not finish in 60 s";
  ASSERT_TRUE((*exit)->success()) << kPython << " (needs Debian's python3-jinja2, from "
                                  << "scripts/install-deps.sh) failed with " << (*exit)->Describe()
                                  << ": " << test_support::ReadWholeFile(dir + "/python.log");
  const json out = json::parse(test_support::ReadWholeFile(dir + "/out.json"));
  ASSERT_EQ(out.size(), cases.size());
  size_t i = 0, refused = 0;
  for (const std::string& fixture : fixtures) {
    std::unique_ptr<ChatTemplate> t = Load(Fixture(fixture));
    ASSERT_NE(t, nullptr);
    for (const auto& messages : conversations) {
      for (const bool add : {true, false}) {
        const json& expected = out[i++];
        const absl::StatusOr<std::string> ours = t->Render(messages, add);
        const std::string where = fixture + ", case " + std::to_string(i - 1);
        if (expected.contains("error")) {
          ++refused;
          ASSERT_FALSE(ours.ok()) << where << " rendered " << *ours;
          EXPECT_THAT(Message(ours.status()), HasSubstr(expected["error"].get<std::string>()))
              << where;
        } else {
          ASSERT_TRUE(ours.ok()) << where << ": " << ours.status();
          EXPECT_EQ(*ours, expected["text"].get<std::string>()) << where;
        }
      }
    }
  }
  // With and without the generation prompt: llama2 and mistral_v03 refuse 'user, user'; mistral
  // (v0.1) refuses it too, and both conversations that start with a system message.
  EXPECT_EQ(refused, 2u * (1 + 1 + 3));
}

TEST(ChatFormatTest, FollowsTheTokenizersFolder) {
  const std::string dir = test_support::MakeTestDir("chat_format");
  // The byte tokenizer, and a folder without tokenizer_config.json: the plain form.
  for (const std::string& spec : {std::string("bytes"), dir, dir + "/vocab.json"}) {
    absl::StatusOr<ChatFormat> format = ChatFormatFor(spec);
    ASSERT_TRUE(format.ok()) << format.status();
    CompletionParams p;
    p.messages = {{"user", "Hi"}};
    EXPECT_FALSE(format->Apply(p)) << spec;
    EXPECT_EQ(p.prompt, "User: Hi\nAssistant:") << spec;
    EXPECT_EQ(p.stop, std::vector<std::string>{std::string(kChatUserStop)});
  }

  // A Hugging Face folder without a template: every chat gets a 400 that names the file.
  WriteFile(dir + "/tokenizer_config.json", json{{"model_max_length", 1024}}.dump());
  absl::StatusOr<ChatFormat> refused = ChatFormatFor(dir + "/tokenizer.json");
  ASSERT_TRUE(refused.ok()) << refused.status();
  CompletionParams p;
  p.messages = {{"user", "Hi"}};
  const std::optional<ApiError> e = refused->Apply(p);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
  EXPECT_THAT(e->message,
              AllOf(HasSubstr("this model has no chat template"),
                    HasSubstr(dir + "/tokenizer_config.json has no \"chat_template\"")));
  EXPECT_THAT(refused->Describe(), HasSubstr("no chat"));

  // With one, the template.
  WriteFile(dir + "/tokenizer_config.json",
            json{{"chat_template",
                  "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ "
                  "m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% "
                  "endif %}"},
                 {"bos_token", "<s>"}}
                .dump());
  absl::StatusOr<ChatFormat> templated = ChatFormatFor(dir);
  ASSERT_TRUE(templated.ok()) << templated.status();
  ASSERT_NE(templated->chat_template(), nullptr);
  EXPECT_THAT(templated->Describe(), HasSubstr(dir + "/tokenizer_config.json"));
  CompletionParams q;
  q.messages = {{"user", "Hi"}, {"tool", "any role reaches the template"}};
  EXPECT_FALSE(templated->Apply(q));
  EXPECT_EQ(q.prompt, "<s><user>Hi<tool>any role reaches the template<a>");
  EXPECT_TRUE(q.stop.empty()) << "no User: stop with a template";

  // A template that renders nothing, and a broken one (an error before serving, naming the file).
  WriteFile(dir + "/tokenizer_config.json", json{{"chat_template", "{# nothing #}"}}.dump());
  CompletionParams r;
  r.messages = {{"user", "Hi"}};
  const std::optional<ApiError> empty = ChatFormatFor(dir)->Apply(r);
  ASSERT_TRUE(empty.has_value());
  EXPECT_THAT(empty->message, HasSubstr("empty prompt"));
  WriteFile(dir + "/tokenizer_config.json", json{{"chat_template", "{% if %}"}}.dump());
  absl::StatusOr<ChatFormat> broken = ChatFormatFor(dir);
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(Message(broken.status()), HasSubstr(dir + "/tokenizer_config.json"));
}

}  // namespace
}  // namespace shardline::serving
