#include "worker/model/data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace shardline::data {
namespace {

using nlohmann::json;

// `s` as a JSON string, for messages; bytes that are not UTF-8 (a merges file may have them) are
// shown as U+FFFD rather than thrown about.
std::string Quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// GPT-2's pre-tokenizer, 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, with \s spelled \p{White_Space}: that is what \s is in
// Oniguruma, which `tokenizers` runs it with, while PCRE2's \s (with UCP) also takes U+180E
// MONGOLIAN VOWEL SEPARATOR (Perl's \h).
constexpr char kPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+)"
    R"(|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

// Ids are indices into tables sized by the largest id, so a few bytes of vocabulary naming id
// 2^31 - 2 would make the loader allocate about 100 GB. 2^21 is 8 times the largest vocabularies
// in use (Gemma's 262,144) and keeps what a hostile file can make us allocate near 100 MB.
constexpr int64_t kMaxTokenId = (int64_t{1} << 21) - 1;

// Whether a JSON value is an id the tokenizer takes: an integer in [0, kMaxTokenId].
bool IsTokenId(const json& id) {
  return id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= kMaxTokenId;
}

// Above this many cached pre-tokens the cache starts again: a bound on memory for a server that
// sees unbounded text, far above the distinct words of one prompt or document.
constexpr size_t kMaxCacheEntries = 1 << 17;

struct ByteAlphabet {
  std::array<std::string, 256> chars;  // byte → UTF-8 of its stand-in character
  std::array<int16_t, 324> bytes;      // stand-in code point → byte, -1 for none
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    a.bytes.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      a.bytes[cp] = static_cast<int16_t>(b);
      // Every stand-in is below U+0800: one or two UTF-8 bytes.
      if (cp < 0x80) {
        a.chars[b] = std::string(1, static_cast<char>(cp));
      } else {
        a.chars[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
    }
    return a;
  }();
  return alphabet;
}

// The length of the well-formed UTF-8 sequence at text[i] (Unicode's Table 3-7: no overlong
// forms, no surrogates, nothing past U+10FFFF), or 0 when the bytes there are not one.
size_t Utf8SequenceLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) -> int {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : -1;
  };
  const auto in = [](int v, int lo, int hi) { return v >= lo && v <= hi; };
  const int b0 = byte(0);
  if (b0 < 0x80) return 1;
  if (in(b0, 0xC2, 0xDF)) return in(byte(1), 0x80, 0xBF) ? 2 : 0;
  if (in(b0, 0xE0, 0xEF)) {
    const int lo = b0 == 0xE0 ? 0xA0 : 0x80;
    const int hi = b0 == 0xED ? 0x9F : 0xBF;
    return in(byte(1), lo, hi) && in(byte(2), 0x80, 0xBF) ? 3 : 0;
  }
  if (in(b0, 0xF0, 0xF4)) {
    const int lo = b0 == 0xF0 ? 0x90 : 0x80;
    const int hi = b0 == 0xF4 ? 0x8F : 0xBF;
    return in(byte(1), lo, hi) && in(byte(2), 0x80, 0xBF) && in(byte(3), 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

// The bytes a vocabulary entry stands for, or nullopt when a character of it is not in the byte
// alphabet (`bad` gets that character's code point). `token` is valid UTF-8 (JSON strings are).
std::optional<std::string> TokenBytes(std::string_view token, uint32_t* bad) {
  const ByteAlphabet& alphabet = Alphabet();
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const size_t len = std::max<size_t>(Utf8SequenceLength(token, i), 1);
    uint32_t cp = static_cast<unsigned char>(token[i]);
    if (len > 1) {
      cp &= 0x7F >> len;
      for (size_t k = 1; k < len && i + k < token.size(); ++k) {
        cp = (cp << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
      }
    }
    if (cp >= alphabet.bytes.size() || alphabet.bytes[cp] < 0) {
      *bad = cp;
      return std::nullopt;
    }
    bytes.push_back(static_cast<char>(alphabet.bytes[cp]));
    i += len;
  }
  return bytes;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  // stat first: std::ifstream opens a directory "successfully" and then fails to read.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    const std::string message = absl::StrCat(path, ": cannot open: ", std::strerror(error));
    if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(message);
    if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
    return absl::InvalidArgumentError(message);
  }
  if (S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, expected a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    const std::string message = absl::StrCat(path, ": cannot open: ", std::strerror(error));
    if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
    return absl::InvalidArgumentError(message);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
  }
  return std::move(contents).str();
}

absl::StatusOr<json> ParseJson(const std::string& path, const std::string& contents) {
  try {
    return json::parse(contents);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based and may be one past the end (unexpected end of input).
    const size_t at = std::min(contents.size(), e.byte > 0 ? e.byte - 1 : 0);
    const size_t line = 1 + std::count(contents.begin(), contents.begin() + at, '\n');
    const size_t line_start = at == 0 ? std::string::npos : contents.rfind('\n', at - 1);
    const size_t column = line_start == std::string::npos ? at + 1 : at - line_start;
    // what() is "[json.exception.parse_error.101] parse error at line L, column C: WHY".
    const std::string what = e.what();
    const size_t colon = what.find(": ");
    const std::string why = colon == std::string::npos ? what : what.substr(colon + 2);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " line ", line, " column ", column, ": malformed JSON: ", why));
  } catch (const json::exception& e) {
    // A number past double's range ("1e400") is out_of_range, not a parse_error, and has no
    // position.
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON: ", e.what()));
  }
}

// `object` (a JSON object of token → id, named `where`) as pairs.
absl::StatusOr<std::vector<std::pair<std::string, Token>>> VocabEntries(const json& object,
                                                                        const std::string& where) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a JSON object of token to id, got ", object.type_name()));
  }
  std::vector<std::pair<std::string, Token>> vocab;
  vocab.reserve(object.size());
  for (const auto& [token, id] : object.items()) {
    if (!IsTokenId(id)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": token ", Quote(token), " has id ",
                                                     id.dump(), ", expected an integer in [0, ",
                                                     kMaxTokenId, "]"));
    }
    vocab.emplace_back(token, static_cast<Token>(id.get<int64_t>()));
  }
  return vocab;
}

}  // namespace

std::string_view Gpt2ByteChar(unsigned char byte) { return Alphabet().chars[byte]; }

struct Gpt2Tokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::FromFiles(
    const std::string& vocab_path, const std::string& merges_path) {
  ASSIGN_OR_RETURN(const std::string vocab_text, ReadFile(vocab_path));
  ASSIGN_OR_RETURN(const std::string merges_text, ReadFile(merges_path));
  ASSIGN_OR_RETURN(const json vocab_json, ParseJson(vocab_path, vocab_text));
  ASSIGN_OR_RETURN(auto vocab, VocabEntries(vocab_json, vocab_path));

  std::vector<MergeEntry> merges;
  size_t line_number = 0;
  for (size_t start = 0; start < merges_text.size();) {
    size_t end = merges_text.find('\n', start);
    if (end == std::string::npos) end = merges_text.size();
    std::string_view line(merges_text.data() + start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // "#version" lines are what `tokenizers` skips; blank lines (GPT-2's vocab.bpe ends with a
    // newline, which its encoder.py drops too) carry nothing.
    if (line.empty() || line.substr(0, 8) == "#version") continue;
    const std::string where = absl::StrCat(merges_path, " line ", line_number);
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected a merge, two tokens separated by one space, got ", Quote(line)));
    }
    merges.push_back(
        {std::string(line.substr(0, space)), std::string(line.substr(space + 1)), where});
  }

  std::vector<Special> specials;
  for (const auto& [token, id] : vocab) {
    if (token == kEndOfText) specials.push_back({token, id});
  }
  return Build(vocab_path, vocab_path, std::move(vocab), std::move(merges), std::move(specials));
}

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::FromTokenizerJson(
    const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  ASSIGN_OR_RETURN(const json root, ParseJson(path, text));
  const auto invalid = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  const auto unlike_gpt2 = [&](const std::string& what) {
    return invalid(what + ", which GPT-2's byte-level BPE does not have (only that is computed)");
  };
  if (!root.is_object())
    return invalid("expected a JSON object, got " + std::string(root.type_name()));
  const auto member = [](const json& object, const char* key) -> const json* {
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  };
  const json* model = member(root, "model");
  if (model == nullptr || !model->is_object()) return invalid("no \"model\" object");
  if (const json* type = member(*model, "type"); type != nullptr && *type != "BPE") {
    return unlike_gpt2("model.type is " + type->dump());
  }
  if (member(*model, "dropout") != nullptr) return unlike_gpt2("model.dropout is set");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* affix = member(*model, key); affix != nullptr && *affix != "") {
      return unlike_gpt2(absl::StrCat("model.", key, " is ", affix->dump()));
    }
  }
  if (const json* ignore = member(*model, "ignore_merges"); ignore != nullptr && *ignore != false) {
    return unlike_gpt2("model.ignore_merges is set");
  }
  if (member(root, "normalizer") != nullptr) return unlike_gpt2("a normalizer is set");
  const json* pre = member(root, "pre_tokenizer");
  if (pre == nullptr || !pre->is_object() || pre->value("type", "") != "ByteLevel" ||
      pre->value("add_prefix_space", true) || !pre->value("use_regex", true)) {
    return unlike_gpt2("pre_tokenizer is " + (pre == nullptr ? "null" : pre->dump()) +
                       " rather than ByteLevel without add_prefix_space");
  }

  const json* vocab_json = member(*model, "vocab");
  if (vocab_json == nullptr) return invalid("no model.vocab");
  ASSIGN_OR_RETURN(auto vocab, VocabEntries(*vocab_json, path + ": model.vocab"));

  std::vector<MergeEntry> merges;
  if (const json* list = member(*model, "merges"); list != nullptr) {
    if (!list->is_array()) return invalid("model.merges is not an array");
    merges.reserve(list->size());
    for (size_t i = 0; i < list->size(); ++i) {
      const json& m = (*list)[i];
      const std::string where = absl::StrCat(path, ": model.merges[", i, "]");
      if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.push_back({m[0].get<std::string>(), m[1].get<std::string>(), where});
        continue;
      }
      const std::string s = m.is_string() ? m.get<std::string>() : std::string();
      const size_t space = s.find(' ');
      if (!m.is_string() || space == std::string::npos || space == 0 || space + 1 == s.size() ||
          s.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": expected \"a b\" or [\"a\", \"b\"], got ", m.dump()));
      }
      merges.push_back({s.substr(0, space), s.substr(space + 1), where});
    }
  }

  std::vector<Special> specials;
  if (const json* added = member(root, "added_tokens"); added != nullptr) {
    if (!added->is_array()) return invalid("added_tokens is not an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& t = (*added)[i];
      const std::string where = absl::StrCat("added_tokens[", i, "]");
      const json* id = t.is_object() ? member(t, "id") : nullptr;
      const json* content = t.is_object() ? member(t, "content") : nullptr;
      if (id == nullptr || !IsTokenId(*id) || content == nullptr || !content->is_string() ||
          content->get<std::string>().empty()) {
        return invalid(absl::StrCat(where, ": expected an object with an id in [0, ", kMaxTokenId,
                                    "] and a non-empty content, got ", t.dump()));
      }
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (t.value(flag, false)) return unlike_gpt2(absl::StrCat(where, ".", flag, " is set"));
      }
      specials.push_back({content->get<std::string>(), static_cast<Token>(id->get<int64_t>())});
    }
  }
  return Build(path, path + ": model.vocab", std::move(vocab), std::move(merges),
               std::move(specials));
}

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Build(
    std::string source, const std::string& vocab_where,
    std::vector<std::pair<std::string, Token>> vocab, std::vector<MergeEntry> merges,
    std::vector<Special> specials) {
  std::unique_ptr<Gpt2Tokenizer> t(new Gpt2Tokenizer());
  t->source_ = std::move(source);

  Token size = 0;
  for (const auto& [token, id] : vocab) size = std::max(size, id + 1);
  for (const Special& s : specials) size = std::max(size, s.id + 1);
  t->token_bytes_.resize(static_cast<size_t>(size));
  std::vector<const std::string*> owner(static_cast<size_t>(size), nullptr);
  absl::flat_hash_map<std::string, Token> ids;
  ids.reserve(vocab.size());
  const auto is_special = [&](const std::string& token) {
    return std::any_of(specials.begin(), specials.end(),
                       [&](const Special& s) { return s.text == token; });
  };
  for (const auto& [token, id] : vocab) {
    if (owner[id] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(vocab_where, ": tokens ", Quote(*owner[id]),
                                                     " and ", Quote(token), " both have id ", id));
    }
    owner[id] = &token;
    ids.emplace(token, id);
    uint32_t bad = 0;
    std::optional<std::string> bytes = TokenBytes(token, &bad);
    if (!bytes && !is_special(token)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: token %s (id %d) has the character U+%04X, which is not one of GPT-2's byte "
          "characters",
          vocab_where, Quote(token), id, bad));
    }
    t->token_bytes_[id] = bytes ? std::move(*bytes) : token;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = ids.find(std::string(Gpt2ByteChar(static_cast<unsigned char>(b))));
    if (it == ids.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the vocabulary lacks the token of byte 0x%02X (%s), which every byte-level BPE "
          "vocabulary has",
          vocab_where, b, Quote(Gpt2ByteChar(static_cast<unsigned char>(b)))));
    }
    t->byte_tokens_[b] = it->second;
  }

  t->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const MergeEntry& m = merges[rank];
    const std::string merged = m.a + m.b;
    Token parts[3];
    const std::string* names[3] = {&m.a, &m.b, &merged};
    for (int k = 0; k < 3; ++k) {
      const auto it = ids.find(*names[k]);
      if (it == ids.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            m.where, ": merge ", Quote(m.a + " " + m.b), ": ", Quote(*names[k]),
            k == 2 ? " (the merged token)" : "", " is not in the vocabulary ", vocab_where));
      }
      parts[k] = it->second;
    }
    // A pair listed twice keeps its later rank, as in `tokenizers` and GPT-2's encoder.py (both
    // build a map from the list in order).
    t->merges_.insert_or_assign(
        (static_cast<uint64_t>(parts[0]) << 32) | static_cast<uint32_t>(parts[1]),
        Merge{static_cast<int32_t>(rank), parts[2]});
  }

  for (Special& s : specials) {
    t->token_bytes_[s.id] = s.text;
    if (s.text == kEndOfText) t->eot_ = s.id;
  }
  t->specials_ = std::move(specials);

  int error = 0;
  PCRE2_SIZE offset = 0;
  t->regex_ = std::make_unique<Regex>();
  t->regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (t->regex_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InternalError(absl::StrCat("GPT-2 pre-tokenizer regex: PCRE2 error at offset ",
                                            offset, ": ", reinterpret_cast<char*>(message)));
  }
  // Without JIT support (some architectures) pcre2_match interprets the same pattern: slower only.
  pcre2_jit_compile(t->regex_->code, PCRE2_JIT_COMPLETE);
  return t;
}

std::vector<Token> Gpt2Tokenizer::Encode(std::string_view text, Specials specials) const {
  std::vector<Token> out;
  out.reserve(text.size() / 3 + 1);
  if (specials == Specials::kAsText || specials_.empty()) {
    EncodeOrdinary(text, out);
    return out;
  }
  // Leftmost special first, the longest of those that start there (`tokenizers`' matching).
  std::vector<size_t> next(specials_.size());
  for (size_t i = 0; i < specials_.size(); ++i) next[i] = text.find(specials_[i].text);
  size_t pos = 0;
  while (true) {
    size_t best = std::string_view::npos;
    const Special* found = nullptr;
    for (size_t i = 0; i < specials_.size(); ++i) {
      if (next[i] != std::string_view::npos && next[i] < pos) {
        next[i] = text.find(specials_[i].text, pos);
      }
      if (next[i] == std::string_view::npos) continue;
      if (next[i] < best || (next[i] == best && specials_[i].text.size() > found->text.size())) {
        best = next[i];
        found = &specials_[i];
      }
    }
    if (found == nullptr) break;
    EncodeOrdinary(text.substr(pos, best - pos), out);
    out.push_back(found->id);
    pos = best + found->text.size();
  }
  EncodeOrdinary(text.substr(pos), out);
  return out;
}

// Splitting here, rather than matching with PCRE2_MATCH_INVALID_UTF, keeps what a valid run
// encodes to independent of how PCRE2 treats invalid bytes next to lookarounds, and lets every
// match skip PCRE2's UTF check (which otherwise rescans the rest of the subject on each call).
void Gpt2Tokenizer::EncodeOrdinary(std::string_view text, std::vector<Token>& out) const {
  size_t run = 0;
  for (size_t i = 0; i < text.size();) {
    if (const size_t len = Utf8SequenceLength(text, i); len > 0) {
      i += len;
      continue;
    }
    if (run < i) EncodeValidUtf8(text.substr(run, i - run), out);
    out.push_back(byte_tokens_[static_cast<unsigned char>(text[i])]);
    run = ++i;
  }
  if (run < text.size()) EncodeValidUtf8(text.substr(run), out);
}

void Gpt2Tokenizer::EncodeValidUtf8(std::string_view text, std::vector<Token>& out) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(regex_->code, nullptr), &pcre2_match_data_free);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(regex_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                               match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      // Only a resource limit could stop this pattern (it has no nested repeats); the rest is
      // then byte tokens, which still decode to the text.
      for (size_t i = pos; i < text.size(); ++i) {
        out.push_back(byte_tokens_[static_cast<unsigned char>(text[i])]);
      }
      return;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    // Text between matches would be a pre-token of its own in `tokenizers` (its Isolated split);
    // this pattern matches every character, so there is none, but it is not dropped if there is.
    if (ovector[0] > pos) EncodePreToken(text.substr(pos, ovector[0] - pos), out);
    if (ovector[1] == ovector[0]) {  // no alternative matches empty; never loop on one
      pos = ovector[0] + std::max<size_t>(Utf8SequenceLength(text, ovector[0]), 1);
      EncodePreToken(text.substr(ovector[0], pos - ovector[0]), out);
      continue;
    }
    EncodePreToken(text.substr(ovector[0], ovector[1] - ovector[0]), out);
    pos = ovector[1];
  }
  if (pos < text.size()) EncodePreToken(text.substr(pos), out);
}

void Gpt2Tokenizer::EncodePreToken(std::string_view piece, std::vector<Token>& out) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    // Debian's Abseil has its own string_view, which flat_hash_map's heterogeneous lookup takes.
    if (const auto it = cache_.find(absl::string_view(piece.data(), piece.size()));
        it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<Token> ids = Bpe(piece);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::string(piece), std::move(ids));
}

// GPT-2's encoder.py: find the adjacent pair of lowest merge rank, merge every occurrence of it
// left to right, repeat until no adjacent pair has a merge.
std::vector<Token> Gpt2Tokenizer::Bpe(std::string_view piece) const {
  std::vector<Token> word;
  word.reserve(piece.size());
  for (char c : piece) word.push_back(byte_tokens_[static_cast<unsigned char>(c)]);
  while (word.size() > 1) {
    const Merge* best = nullptr;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it =
          merges_.find((static_cast<uint64_t>(word[i]) << 32) | static_cast<uint32_t>(word[i + 1]));
      if (it != merges_.end() && (best == nullptr || it->second.rank < best->rank)) {
        best = &it->second;
        best_at = i;
      }
    }
    if (best == nullptr) break;
    const Token left = word[best_at];
    const Token right = word[best_at + 1];
    size_t w = 0;
    for (size_t r = 0; r < word.size(); ++w) {
      if (r + 1 < word.size() && word[r] == left && word[r + 1] == right) {
        word[w] = best->result;
        r += 2;
      } else {
        word[w] = word[r];
        r += 1;
      }
    }
    word.resize(w);
  }
  return word;
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(std::span<const Token> tokens) const {
  std::string text;
  text.reserve(tokens.size() * 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const Token token = tokens[i];
    if (token < 0 || token >= vocab_size() || !token_bytes_[token]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GPT-2 tokenizer: token ", token, " at position ", i, " is outside the vocabulary",
          token >= 0 && token < vocab_size() ? " (an id no token has)" : "", " of size ",
          vocab_size(), " of ", source_));
    }
    text.append(*token_bytes_[token]);
  }
  return text;
}

}  // namespace shardline::data
