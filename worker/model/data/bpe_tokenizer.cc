#include "worker/model/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/data/tokenizer_files.h"

namespace shardline::data {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer as `tokenizers`' ByteLevel has it (an Oniguruma pattern, translated like
// any other by OnigurumaToPcre2).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

// The length of the character at text[i]: its UTF-8 sequence, or 1 for a byte that starts none.
size_t CharLength(std::string_view text, size_t i) {
  return std::max<size_t>(Utf8SequenceLength(text, i), 1);
}

// The code point of the `len` bytes at text[i] (a well-formed sequence, or one byte).
uint32_t CodePoint(std::string_view text, size_t i, size_t len) {
  uint32_t cp = static_cast<unsigned char>(text[i]);
  if (len == 1) return cp;
  cp &= 0x7F >> len;
  for (size_t k = 1; k < len; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  return cp;
}

// Unicode's White_Space property: what \s is to Oniguruma and to Rust's regex crate.
bool IsWhiteSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// The bytes a byte-level vocabulary entry stands for, or nullopt when a character of it is not in
// the byte alphabet (`bad` gets that character's code point).
std::optional<std::string> TokenBytes(std::string_view token, uint32_t* bad) {
  const ByteAlphabet& alphabet = Alphabet();
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const size_t len = CharLength(token, i);
    const uint32_t cp = CodePoint(token, i, std::min(len, token.size() - i));
    if (cp >= alphabet.bytes.size() || alphabet.bytes[cp] < 0) {
      *bad = cp;
      return std::nullopt;
    }
    bytes.push_back(static_cast<char>(alphabet.bytes[cp]));
    i += len;
  }
  return bytes;
}

// `tokenizers` runs its patterns with Oniguruma (Ruby syntax); PCRE2 reads most of them alike. The
// class escapes differ, so they are spelled out as the sets Oniguruma gives them with UTF-8
// (\s: White_Space, where PCRE2's also takes U+180E; \w: letters, marks, numbers and connector
// punctuation, where PCRE2's lacks the marks; \h: a hexadecimal digit, where PCRE2's is horizontal
// space), and \uHHHH becomes \x{HHHH}. Ruby's ^ and $ are line anchors: PCRE2_MULTILINE, at
// compile time. Returns an error message for what has no PCRE2 spelling (a negated set inside a
// class, a class inside a class).
absl::StatusOr<std::string> OnigurumaToPcre2(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      const auto set = [&](const char* members, bool negated) -> absl::Status {
        if (!in_class) {
          absl::StrAppend(&out, negated ? "[^" : "[", members, "]");
        } else if (negated) {
          return absl::InvalidArgumentError(absl::StrCat(
              "\\", std::string(1, e), " inside a character class has no PCRE2 spelling"));
        } else {
          out += members;
        }
        return absl::OkStatus();
      };
      switch (e) {
        case 's':
          out += R"(\p{White_Space})";
          break;
        case 'S':
          out += R"(\P{White_Space})";
          break;
        case 'w':
          RETURN_IF_ERROR(set(R"(\p{L}\p{M}\p{N}\p{Pc})", false));
          break;
        case 'W':
          RETURN_IF_ERROR(set(R"(\p{L}\p{M}\p{N}\p{Pc})", true));
          break;
        case 'h':
          RETURN_IF_ERROR(set("0-9A-Fa-f", false));
          break;
        case 'H':
          RETURN_IF_ERROR(set("0-9A-Fa-f", true));
          break;
        case 'u':
          if (i + 4 < p.size() && std::all_of(p.begin() + i + 1, p.begin() + i + 5, [](char h) {
                return std::isxdigit(static_cast<unsigned char>(h)) != 0;
              })) {
            absl::StrAppend(&out, "\\x{", std::string(p.substr(i + 1, 4)), "}");
            i += 4;
            break;
          }
          [[fallthrough]];
        default:
          out += '\\';
          out += e;
      }
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]: PCRE2 has them too
        const size_t end = p.find(":]", i + 2);
        if (end != std::string_view::npos) {
          out += p.substr(i, end + 2 - i);
          i = end + 1;
          continue;
        }
      }
      if (c == '[') {
        return absl::InvalidArgumentError("a character class inside a class has no PCRE2 spelling");
      }
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    out += c;
    if (c == '[') {
      in_class = true;
      // A ']' first in a class (after an optional '^') is a member, not the end.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
    }
  }
  return out;
}

// Where each pattern splits a text: (begin, end, matched) slices that cover it in order, as
// `tokenizers`' Pattern::find_matches gives them.
struct Slice {
  size_t begin, end;
  bool matched;
};

// `tokenizers`' NormalizedString::split: which slices become pieces under `behavior`, as (begin,
// end) pairs (possibly empty, which the caller drops).
std::vector<std::pair<size_t, size_t>> ApplyBehavior(const std::vector<Slice>& slices,
                                                     SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> pieces;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Slice& s : slices) pieces.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Slice& s : slices) {
        if (!s.matched) pieces.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kContiguous: {
      bool previous = false;
      for (const Slice& s : slices) {
        if (s.matched == previous && !pieces.empty()) {
          pieces.back().second = s.end;
        } else {
          pieces.emplace_back(s.begin, s.end);
        }
        previous = s.matched;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Slice& s : slices) {
        if (s.matched && !previous && !pieces.empty()) {
          pieces.back().second = s.end;
        } else {
          pieces.emplace_back(s.begin, s.end);
        }
        previous = s.matched;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = slices.rbegin(); it != slices.rend(); ++it) {
        if (it->matched && !previous && !pieces.empty()) {
          pieces.back().first = it->begin;
        } else {
          pieces.emplace_back(it->begin, it->end);
        }
        previous = it->matched;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
  }
  return pieces;
}

// Every occurrence of `literal` (not empty) in `text`, left to right, not overlapping.
std::vector<Slice> LiteralSlices(std::string_view text, std::string_view literal) {
  std::vector<Slice> slices;
  size_t prev = 0;
  for (size_t at = text.find(literal); at != std::string_view::npos;
       at = text.find(literal, at + literal.size())) {
    if (at > prev) slices.push_back({prev, at, false});
    slices.push_back({at, at + literal.size(), true});
    prev = at + literal.size();
  }
  if (prev < text.size()) slices.push_back({prev, text.size(), false});
  return slices;
}

}  // namespace

std::string_view Gpt2ByteChar(unsigned char byte) { return Alphabet().chars[byte]; }

struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }

  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern,
                                                        const std::string& where) {
    absl::StatusOr<std::string> translated = OnigurumaToPcre2(pattern);
    if (!translated.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": pattern ", Quote(pattern), ": ", translated.status().message()));
    }
    int error = 0;
    PCRE2_SIZE offset = 0;
    auto regex = std::make_unique<Regex>();
    regex->code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated->data()), translated->size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
    if (regex->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": pattern ", Quote(pattern), " (as PCRE2 reads it: ", Quote(*translated),
          "): error at offset ", offset, ": ", reinterpret_cast<char*>(message)));
    }
    // Without JIT support (some architectures) pcre2_match interprets the same pattern: slower.
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
    return regex;
  }

  // The pattern's matches in `text` (valid UTF-8), left to right, appended as slices from
  // `base` on; an empty match is a slice of its own, and the search goes on a character later
  // (as Oniguruma's find_iter). Should PCRE2 give up (a resource limit: a pattern with nested
  // repeats), the rest is one unmatched slice: still encoded, only cut less finely.
  void AppendMatches(std::string_view text, size_t base, std::vector<Slice>& out) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t prev = 0;
    size_t pos = 0;
    while (pos <= text.size()) {
      const int rc =
          pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
      if (rc < 0) break;  // no match, or PCRE2 gave up
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
      const size_t begin = ovector[0];
      const size_t end = ovector[1];
      if (begin > prev) out.push_back({base + prev, base + begin, false});
      out.push_back({base + begin, base + end, true});
      prev = end;
      if (end > begin) {
        pos = end;
      } else if (begin < text.size()) {
        pos = begin + CharLength(text, begin);
      } else {
        break;
      }
    }
    if (prev < text.size()) out.push_back({base + prev, base + text.size(), false});
  }

  // Slices of `text`, which may hold bytes that are not UTF-8: the pattern runs on each valid run
  // between them, and each such byte is an unmatched slice of its own.
  std::vector<Slice> Slices(std::string_view text) const {
    std::vector<Slice> slices;
    size_t run = 0;
    for (size_t i = 0; i <= text.size();) {
      const bool end = i == text.size();
      const size_t len = end ? 0 : Utf8SequenceLength(text, i);
      if (!end && len > 0) {
        i += len;
        continue;
      }
      if (run < i) AppendMatches(text.substr(run, i - run), run, slices);
      if (end) break;
      slices.push_back({i, i + 1, false});
      run = ++i;
    }
    return slices;
  }
};

BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromGpt2Files(
    const std::string& vocab_path, const std::string& merges_path) {
  ASSIGN_OR_RETURN(const std::string vocab_text, ReadFile(vocab_path));
  ASSIGN_OR_RETURN(const std::string merges_text, ReadFile(merges_path));
  ASSIGN_OR_RETURN(const json vocab_json, ParseJson(vocab_path, vocab_text));
  BpePipeline pipeline;
  pipeline.kind = "GPT-2 BPE";
  pipeline.source = vocab_path;
  pipeline.vocab_where = vocab_path;
  ASSIGN_OR_RETURN(pipeline.vocab, VocabEntries(vocab_json, vocab_path));

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
    pipeline.merges.push_back(
        {std::string(line.substr(0, space)), std::string(line.substr(space + 1)), where});
  }

  // As transformers' GPT2TokenizerFast builds it from these files.
  BpePipeline::PreTokenizer byte_level;
  byte_level.kind = BpePipeline::PreTokenizer::Kind::kByteLevel;
  byte_level.where = vocab_path;
  pipeline.pre_tokenizers.push_back(byte_level);
  pipeline.decoders = std::vector<BpePipeline::Decoder>(1);
  pipeline.decoders->back().kind = BpePipeline::Decoder::Kind::kByteLevel;
  for (const auto& [token, id] : pipeline.vocab) {
    if (token == kEndOfText) {
      BpePipeline::AddedToken special;
      special.content = token;
      special.id = id;
      special.special = true;
      pipeline.added_tokens.push_back(std::move(special));
      pipeline.eot = id;
    }
  }
  return Create(std::move(pipeline));
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(BpePipeline pipeline) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  const std::string& where = pipeline.vocab_where;
  for (size_t i = 0; i < pipeline.pre_tokenizers.size(); ++i) {
    if (pipeline.pre_tokenizers[i].kind == BpePipeline::PreTokenizer::Kind::kByteLevel &&
        i + 1 != pipeline.pre_tokenizers.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(pipeline.pre_tokenizers[i].where,
                       ": ByteLevel is supported only as the last pre-tokenizer (those after it "
                       "would see its byte characters)"));
    }
  }
  t->byte_level_ =
      !pipeline.pre_tokenizers.empty() &&
      pipeline.pre_tokenizers.back().kind == BpePipeline::PreTokenizer::Kind::kByteLevel;

  Token size = 0;
  for (const auto& [token, id] : pipeline.vocab) size = std::max(size, id + 1);
  for (const BpePipeline::AddedToken& a : pipeline.added_tokens) size = std::max(size, a.id + 1);
  t->token_text_.resize(static_cast<size_t>(size));
  absl::flat_hash_map<std::string, Token> ids;  // vocabulary spelling → id
  ids.reserve(pipeline.vocab.size());
  const auto is_added = [&](const std::string& token) {
    return std::any_of(pipeline.added_tokens.begin(), pipeline.added_tokens.end(),
                       [&](const BpePipeline::AddedToken& a) { return a.content == token; });
  };
  for (const auto& [token, id] : pipeline.vocab) {
    if (t->token_text_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tokens ", Quote(*t->token_text_[id]),
                                                     " and ", Quote(token), " both have id ", id));
    }
    t->token_text_[id] = token;
    ids.emplace(token, id);
    if (!t->byte_level_) {
      t->ids_by_bytes_.emplace(token, id);
      continue;
    }
    uint32_t bad = 0;
    std::optional<std::string> bytes = TokenBytes(token, &bad);
    if (bytes) {
      t->ids_by_bytes_.emplace(std::move(*bytes), id);
    } else if (!is_added(token)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: token %s (id %d) has the character U+%04X, which is not one of the byte-level "
          "characters (GPT-2's bytes_to_unicode) that a ByteLevel pre-tokenizer's vocabulary "
          "is spelled in",
          where, Quote(token), id, bad));
    }
  }
  for (int b = 0; b < 256; ++b) {
    const std::string name = t->byte_level_
                                 ? std::string(Gpt2ByteChar(static_cast<unsigned char>(b)))
                                 : absl::StrFormat("<0x%02X>", b);
    const auto it = ids.find(name);
    if (it != ids.end()) {
      t->byte_tokens_[b] = it->second;
      t->has_byte_token_[b] = true;
    } else if (t->byte_level_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the vocabulary lacks the token of byte 0x%02X (%s), which every byte-level BPE "
          "vocabulary has",
          where, b, Quote(name)));
    }
  }
  if (pipeline.unk_token) {
    const auto it = ids.find(*pipeline.unk_token);
    if (it == ids.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the unk_token ", Quote(*pipeline.unk_token), " is not in the vocabulary"));
    }
    t->unk_ = it->second;
  }

  t->merges_.reserve(pipeline.merges.size());
  for (size_t rank = 0; rank < pipeline.merges.size(); ++rank) {
    const BpePipeline::Merge& m = pipeline.merges[rank];
    const std::string merged = m.a + m.b;
    Token parts[3];
    const std::string* names[3] = {&m.a, &m.b, &merged};
    for (int k = 0; k < 3; ++k) {
      const auto it = ids.find(*names[k]);
      if (it == ids.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(m.where, ": merge ", Quote(m.a + " " + m.b), ": ", Quote(*names[k]),
                         k == 2 ? " (the merged token)" : "", " is not in the vocabulary ", where));
      }
      parts[k] = it->second;
    }
    // A pair listed twice keeps its later rank, as in `tokenizers` and GPT-2's encoder.py (both
    // build a map from the list in order).
    t->merges_.insert_or_assign(
        (static_cast<uint64_t>(parts[0]) << 32) | static_cast<uint32_t>(parts[1]),
        Merge{static_cast<int32_t>(rank), parts[2]});
  }
  pipeline.vocab.clear();
  pipeline.vocab.shrink_to_fit();
  pipeline.merges.clear();
  pipeline.merges.shrink_to_fit();

  for (const BpePipeline::Normalizer& n : pipeline.normalizers) {
    std::unique_ptr<Regex> regex;
    if (n.kind == BpePipeline::Normalizer::Kind::kReplace && n.regex) {
      ASSIGN_OR_RETURN(regex, Regex::Compile(n.text, n.where));
    }
    t->normalizer_regex_.push_back(std::move(regex));
  }
  for (const BpePipeline::PreTokenizer& p : pipeline.pre_tokenizers) {
    std::unique_ptr<Regex> regex;
    if (p.kind == BpePipeline::PreTokenizer::Kind::kSplit && p.regex) {
      ASSIGN_OR_RETURN(regex, Regex::Compile(p.pattern, p.where));
    }
    if (p.kind == BpePipeline::PreTokenizer::Kind::kByteLevel && p.use_regex) {
      ASSIGN_OR_RETURN(t->byte_level_regex_, Regex::Compile(kGpt2Pattern, "GPT-2's pattern"));
    }
    t->pre_tokenizer_regex_.push_back(std::move(regex));
  }
  t->pipeline_ = std::move(pipeline);

  // Added tokens: those with normalized=false are found in the raw text, the others in the
  // normalized text as the normalizers spell them (`tokenizers`' refresh_added_tokens).
  for (size_t i = 0; i < t->pipeline_.added_tokens.size(); ++i) {
    const BpePipeline::AddedToken& a = t->pipeline_.added_tokens[i];
    t->token_text_[a.id] = a.content;
    if (a.content.empty()) continue;
    if (a.normalized) {
      // Decoded from its normalized form too (`tokenizers`' simple_id_to_token), so that the
      // decoders undo what the normalizers did ("▁shard" gives " shard").
      t->token_text_[a.id] = t->Normalize(a.content);
      t->normalized_added_.patterns.emplace_back(*t->token_text_[a.id], i);
    } else {
      t->raw_added_.patterns.emplace_back(a.content, i);
    }
  }
  t->eot_ = t->pipeline_.eot;
  return t;
}

std::string BpeTokenizer::Describe() const {
  return absl::StrCat("the ", pipeline_.kind, " tokenizer of ", pipeline_.source);
}

std::vector<Token> BpeTokenizer::stop_tokens() const {
  if (!pipeline_.stop_tokens.empty()) return pipeline_.stop_tokens;
  return eot_ ? std::vector<Token>{*eot_} : std::vector<Token>{};
}

std::vector<Token> BpeTokenizer::EncodeWithSpecials(std::string_view text) const {
  std::vector<Token> out = pipeline_.prefix;
  const std::vector<Token> ids = Encode(text);
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), pipeline_.suffix.begin(), pipeline_.suffix.end());
  return out;
}

std::vector<Token> BpeTokenizer::Encode(std::string_view text, Specials specials) const {
  std::vector<Token> out;
  out.reserve(text.size() / 3 + 1);
  SplitOnAdded(text, raw_added_, specials, out, [&](std::string_view piece, size_t offset) {
    EncodeSegment(piece, offset == 0, specials, out);
  });
  return out;
}

namespace {

// Whether the character that ends (at_end) or starts `text` is a word character to Rust's regex
// crate (\w: Alphabetic, marks, decimal digits, connector punctuation, Join_Control), as
// `tokenizers`' single_word asks.
bool WordCharAt(std::string_view text, bool at_end) {
  if (text.empty()) return false;
  size_t i = 0;
  if (at_end) {
    i = text.size() - 1;
    while (i > 0 && text.size() - i < 4 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) {
      --i;
    }
    if (Utf8SequenceLength(text, i) != text.size() - i) i = text.size() - 1;
  }
  const size_t len = Utf8SequenceLength(text, i);
  if (len == 0) return false;
  const std::string ch(text.substr(i, len));
  static pcre2_code* const word = [] {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const char pattern[] = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])";
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  }();
  if (word == nullptr) return false;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(word, nullptr), &pcre2_match_data_free);
  return pcre2_match(word, reinterpret_cast<PCRE2_SPTR>(ch.data()), ch.size(), 0,
                     PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, match.get(), nullptr) >= 0;
}

// The length of the run of White_Space characters that ends (at_end) or starts `text`.
size_t WhiteSpaceRun(std::string_view text, bool at_end) {
  if (!at_end) {
    size_t i = 0;
    while (i < text.size()) {
      const size_t len = Utf8SequenceLength(text, i);
      if (len == 0 || !IsWhiteSpace(CodePoint(text, i, len))) break;
      i += len;
    }
    return i;
  }
  size_t begin = text.size();
  while (begin > 0) {
    size_t i = begin - 1;
    while (i > 0 && begin - i < 4 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
    const size_t len = Utf8SequenceLength(text, i);
    if (len != begin - i || !IsWhiteSpace(CodePoint(text, i, len))) break;
    begin = i;
  }
  return text.size() - begin;
}

}  // namespace

template <typename OnText>
void BpeTokenizer::SplitOnAdded(std::string_view text, const AddedMatcher& matcher,
                                Specials specials, std::vector<Token>& out,
                                const OnText& on_text) const {
  if (matcher.patterns.empty() || text.empty()) {
    if (!text.empty()) on_text(text, 0);
    return;
  }
  // Leftmost match first, the longest of those that start there (`tokenizers`' Aho-Corasick
  // automaton, MatchKind::LeftmostLongest); the search goes on after each match, used or not.
  std::vector<size_t> next(matcher.patterns.size());
  for (size_t i = 0; i < next.size(); ++i) next[i] = text.find(matcher.patterns[i].first);
  size_t pos = 0;         // where the search goes on
  size_t text_start = 0;  // where the text not yet given to on_text starts
  while (true) {
    size_t best = std::string_view::npos;
    size_t found = 0;
    for (size_t i = 0; i < next.size(); ++i) {
      if (next[i] != std::string_view::npos && next[i] < pos) {
        next[i] = text.find(matcher.patterns[i].first, pos);
      }
      if (next[i] == std::string_view::npos) continue;
      if (next[i] < best || (next[i] == best && matcher.patterns[i].first.size() >
                                                    matcher.patterns[found].first.size())) {
        best = next[i];
        found = i;
      }
    }
    if (best == std::string_view::npos) break;
    size_t start = best;
    size_t stop = best + matcher.patterns[found].first.size();
    pos = stop;
    const BpePipeline::AddedToken& token = pipeline_.added_tokens[matcher.patterns[found].second];
    if (token.special && specials == Specials::kAsText) continue;
    if (token.single_word && ((start > 0 && WordCharAt(text.substr(0, start), true)) ||
                              (stop < text.size() && WordCharAt(text.substr(stop), false)))) {
      continue;
    }
    if (token.lstrip) {
      start = std::max(start - WhiteSpaceRun(text.substr(0, start), true), text_start);
    }
    if (token.rstrip) stop += WhiteSpaceRun(text.substr(stop), false);
    if (text_start < start) on_text(text.substr(text_start, start - text_start), text_start);
    out.push_back(token.id);
    text_start = std::max(text_start, stop);
  }
  if (text_start < text.size()) on_text(text.substr(text_start), text_start);
}

void BpeTokenizer::EncodeSegment(std::string_view text, bool at_start, Specials specials,
                                 std::vector<Token>& out) const {
  const std::string normalized = Normalize(text);
  SplitOnAdded(normalized, normalized_added_, specials, out,
               [&](std::string_view piece, size_t offset) {
                 for (const Piece& p : PreTokenize(std::string(piece), at_start && offset == 0)) {
                   EncodePreToken(p.text, out);
                 }
               });
}

std::string BpeTokenizer::Normalize(std::string_view text) const {
  std::string s(text);
  for (size_t k = 0; k < pipeline_.normalizers.size(); ++k) {
    const BpePipeline::Normalizer& n = pipeline_.normalizers[k];
    switch (n.kind) {
      case BpePipeline::Normalizer::Kind::kPrepend:
        if (!s.empty()) s = n.text + s;
        break;
      case BpePipeline::Normalizer::Kind::kReplace: {
        if (n.text.empty() && !n.regex) break;
        const std::vector<Slice> slices =
            n.regex ? normalizer_regex_[k]->Slices(s) : LiteralSlices(s, n.text);
        std::string replaced;
        replaced.reserve(s.size());
        for (const Slice& slice : slices) {
          if (slice.matched) {
            replaced += n.content;
          } else {
            replaced.append(s, slice.begin, slice.end - slice.begin);
          }
        }
        s = std::move(replaced);
        break;
      }
    }
  }
  return s;
}

std::vector<BpeTokenizer::Piece> BpeTokenizer::PreTokenize(std::string piece, bool at_start) const {
  std::vector<Piece> pieces;
  if (piece.empty()) return pieces;
  pieces.push_back({std::move(piece), at_start});
  // Cuts every piece where `slices_of` says, under `behavior`, dropping empty pieces.
  const auto split = [&](const auto& slices_of, SplitBehavior behavior) {
    std::vector<Piece> next;
    for (Piece& p : pieces) {
      for (const auto& [begin, end] : ApplyBehavior(slices_of(p.text), behavior)) {
        if (end > begin)
          next.push_back({p.text.substr(begin, end - begin), p.at_start && begin == 0});
      }
    }
    pieces = std::move(next);
  };
  for (size_t k = 0; k < pipeline_.pre_tokenizers.size(); ++k) {
    const BpePipeline::PreTokenizer& pre = pipeline_.pre_tokenizers[k];
    switch (pre.kind) {
      case BpePipeline::PreTokenizer::Kind::kSplit: {
        const Regex* regex = pre_tokenizer_regex_[k].get();
        split(
            [&](std::string_view text) {
              std::vector<Slice> slices =
                  regex != nullptr
                      ? regex->Slices(text)
                      : (pre.pattern.empty() ? std::vector<Slice>{{0, text.size(), false}}
                                             : LiteralSlices(text, pre.pattern));
              if (pre.invert) {
                for (Slice& s : slices) s.matched = !s.matched;
              }
              return slices;
            },
            pre.behavior);
        break;
      }
      case BpePipeline::PreTokenizer::Kind::kMetaspace:
        for (Piece& p : pieces) {
          std::string replaced;
          replaced.reserve(p.text.size() + pre.replacement.size());
          for (char c : p.text) {
            if (c == ' ') {
              replaced += pre.replacement;
            } else {
              replaced += c;
            }
          }
          const bool starts = replaced.compare(0, pre.replacement.size(), pre.replacement) == 0;
          if (!starts && (pre.prepend_scheme == PrependScheme::kAlways ||
                          (pre.prepend_scheme == PrependScheme::kFirst && p.at_start))) {
            replaced = pre.replacement + replaced;
          }
          p.text = std::move(replaced);
        }
        if (pre.split) {
          split([&](std::string_view text) { return LiteralSlices(text, pre.replacement); },
                SplitBehavior::kMergedWithNext);
        }
        break;
      case BpePipeline::PreTokenizer::Kind::kByteLevel:
        if (pre.add_prefix_space) {
          for (Piece& p : pieces) {
            if (p.text[0] != ' ') p.text.insert(p.text.begin(), ' ');
          }
        }
        if (pre.use_regex) {
          split([&](std::string_view text) { return byte_level_regex_->Slices(text); },
                SplitBehavior::kIsolated);
        }
        break;
    }
  }
  return pieces;
}

void BpeTokenizer::EncodePreToken(std::string_view piece, std::vector<Token>& out) const {
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

// `tokenizers`' BPE::merge_word then Word::merge_all: the pre-token's characters (bytes, for a
// byte-level vocabulary) as tokens, then the adjacent pair of lowest merge rank merged (leftmost
// first among equals) until no adjacent pair has a merge, through a priority queue whose stale
// entries are skipped when they come up.
std::vector<Token> BpeTokenizer::Bpe(std::string_view piece) const {
  if (pipeline_.ignore_merges) {
    if (const auto it = ids_by_bytes_.find(absl::string_view(piece.data(), piece.size()));
        it != ids_by_bytes_.end()) {
      return {it->second};
    }
  }
  struct Symbol {
    Token id;
    int prev, next;  // -1 for none
    size_t len;      // bytes; 0 once merged into the symbol on its left
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  const auto add = [&](Token id, size_t len) {
    const int at = static_cast<int>(symbols.size());
    if (!symbols.empty()) symbols.back().next = at;
    symbols.push_back({id, at - 1, -1, len});
  };
  if (byte_level_) {
    for (char c : piece) add(byte_tokens_[static_cast<unsigned char>(c)], 1);
  } else {
    size_t unknown = 0;  // the bytes of an unknown run not yet added (as unk_token)
    for (size_t i = 0; i < piece.size();) {
      const size_t len = CharLength(piece, i);
      const std::string_view ch = piece.substr(i, len);
      i += len;
      if (const auto it = ids_by_bytes_.find(absl::string_view(ch.data(), ch.size()));
          it != ids_by_bytes_.end()) {
        if (unknown > 0) add(*unk_, unknown);
        unknown = 0;
        add(it->second, len);
        continue;
      }
      if (pipeline_.byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char b) {
            return has_byte_token_[static_cast<unsigned char>(b)];
          })) {
        // An unknown run before the bytes stays pending, as in `tokenizers`.
        for (char b : ch) add(byte_tokens_[static_cast<unsigned char>(b)], 1);
        continue;
      }
      if (!unk_) continue;  // no unk_token: `tokenizers` drops the character
      if (unknown > 0 && !pipeline_.fuse_unk) {
        add(*unk_, unknown);
        unknown = 0;
      }
      unknown += len;
    }
    if (unknown > 0) add(*unk_, unknown);
  }

  struct Candidate {
    int32_t rank;
    int pos;
    Token result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const auto merge_of = [&](Token left, Token right) -> const Merge* {
    const auto it =
        merges_.find((static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = merge_of(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int>(i), m->result});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const Symbol right = symbols[left.next];
    // An entry is stale when its pair has changed since it was queued.
    const Merge* now = merge_of(left.id, right.id);
    if (now == nullptr || now->result != top.result) continue;
    symbols[left.next].len = 0;
    left.id = top.result;
    left.len += right.len;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = merge_of(symbols[left.prev].id, left.id)) {
        queue.push({m->rank, left.prev, m->result});
      }
    }
    if (left.next >= 0) {
      if (const Merge* m = merge_of(left.id, symbols[left.next].id)) {
        queue.push({m->rank, top.pos, m->result});
      }
    }
  }
  std::vector<Token> word;
  word.reserve(symbols.size());
  for (const Symbol& s : symbols) {
    if (s.len != 0) word.push_back(s.id);
  }
  return word;
}

absl::StatusOr<std::string> BpeTokenizer::DecodeImpl(std::span<const Token> tokens,
                                                     bool continuation) const {
  // The decoders' list of strings (`tokenizers`' decode_chain), each knowing whether it holds the
  // first token (`boundary`) and whether a decoder joined tokens into it (`merged`): with
  // `continuation`, a piece that starts the decoded span is not the start of the text, and one
  // joined from it does not start where the whole text's piece would.
  struct Piece {
    std::string text;
    bool boundary;
    bool merged;
  };
  std::vector<Piece> pieces;
  pieces.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const Token token = tokens[i];
    if (token < 0 || token >= vocab_size() || !token_text_[token]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: token ", token, " at position ", i, " is outside the vocabulary",
                       token >= 0 && token < vocab_size() ? " (an id no token has)" : "",
                       " of size ", vocab_size(), " of ", pipeline_.source));
    }
    pieces.push_back({*token_text_[token], i == 0, false});
  }
  if (!pipeline_.decoders) {
    std::string text;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (i > 0 || continuation) text += ' ';
      text += pieces[i].text;
    }
    return text;
  }
  const auto join = [](std::vector<Piece>::iterator begin, std::vector<Piece>::iterator end) {
    Piece joined{"", begin->boundary, true};
    for (auto it = begin; it != end; ++it) joined.text += it->text;
    return joined;
  };
  for (const BpePipeline::Decoder& d : *pipeline_.decoders) {
    if (pieces.empty()) break;
    switch (d.kind) {
      case BpePipeline::Decoder::Kind::kByteLevel: {
        for (Piece& p : pieces) {
          // A token with a character outside the alphabet (an added token) is its own bytes.
          uint32_t bad = 0;
          std::optional<std::string> bytes = TokenBytes(p.text, &bad);
          if (bytes) p.text = std::move(*bytes);
        }
        pieces = {join(pieces.begin(), pieces.end())};
        break;
      }
      case BpePipeline::Decoder::Kind::kMetaspace:
        for (size_t i = 0; i < pieces.size(); ++i) {
          const bool first = i == 0 && !continuation;
          std::string out;
          const std::string& text = pieces[i].text;
          for (size_t at = 0; at < text.size();) {
            if (text.compare(at, d.replacement.size(), d.replacement) == 0) {
              if (!(first && d.prepend_scheme != PrependScheme::kNever)) out += ' ';
              at += d.replacement.size();
            } else {
              out += text[at++];
            }
          }
          pieces[i].text = std::move(out);
        }
        break;
      case BpePipeline::Decoder::Kind::kReplace:
        if (d.pattern.empty()) break;
        for (Piece& p : pieces) {
          std::string out;
          for (const Slice& s : LiteralSlices(p.text, d.pattern)) {
            if (s.matched) {
              out += d.content;
            } else {
              out.append(p.text, s.begin, s.end - s.begin);
            }
          }
          p.text = std::move(out);
        }
        break;
      case BpePipeline::Decoder::Kind::kByteFallback: {
        // A run of "<0xXX>" tokens becomes its bytes (kept as they are where `tokenizers` would
        // give U+FFFD for bytes that are not UTF-8).
        const auto byte_of = [](const std::string& s) -> int {
          if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
          int value = 0;
          for (int k = 3; k < 5; ++k) {
            const char c = s[k];
            if (!std::isxdigit(static_cast<unsigned char>(c))) return -1;
            value = value * 16 + (std::isdigit(static_cast<unsigned char>(c))
                                      ? c - '0'
                                      : std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
          }
          return value;
        };
        std::vector<Piece> out;
        for (size_t i = 0; i < pieces.size();) {
          if (byte_of(pieces[i].text) < 0) {
            out.push_back(std::move(pieces[i++]));
            continue;
          }
          Piece run{"", pieces[i].boundary, true};
          for (; i < pieces.size() && byte_of(pieces[i].text) >= 0; ++i) {
            run.text += static_cast<char>(byte_of(pieces[i].text));
          }
          out.push_back(std::move(run));
        }
        pieces = std::move(out);
        break;
      }
      case BpePipeline::Decoder::Kind::kFuse:
        pieces = {join(pieces.begin(), pieces.end())};
        break;
      case BpePipeline::Decoder::Kind::kStrip:
        for (Piece& p : pieces) {
          // Counted in characters, as `tokenizers` does; `content` is one character.
          const std::string& c = d.content;
          if (!(continuation && p.boundary && p.merged)) {
            for (int k = 0; k < d.start && p.text.compare(0, c.size(), c) == 0; ++k) {
              p.text.erase(0, c.size());
            }
          }
          for (int k = 0; k < d.stop && p.text.size() >= c.size() &&
                          p.text.compare(p.text.size() - c.size(), c.size(), c) == 0;
               ++k) {
            p.text.erase(p.text.size() - c.size());
          }
        }
        break;
    }
  }
  std::string text;
  for (const Piece& p : pieces) text += p.text;
  return text;
}

}  // namespace shardline::data
