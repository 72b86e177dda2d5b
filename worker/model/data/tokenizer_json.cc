#include "worker/model/data/tokenizer_json.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/data/tokenizer_files.h"

namespace shardline::data {
namespace {

using nlohmann::json;
namespace stdfs = std::filesystem;

// Reads the fields of one JSON file, every error naming the file and the field's path
// ("DIR/tokenizer.json: pre_tokenizer.pretokenizers[0].type ...").
class Fields {
 public:
  explicit Fields(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", field, " ", what));
  }
  absl::Status Unsupported(const std::string& field, const json& value,
                           const std::string& supported) const {
    return Error(
        field, absl::StrCat(value.is_string() ? "'" + value.get<std::string>() + "'" : value.dump(),
                            " is not supported (", supported, ")"));
  }

  // The member, or nullptr when it is absent or null.
  static const json* Member(const json& object, const char* key) {
    if (!object.is_object()) return nullptr;
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }

  absl::StatusOr<bool> Bool(const json& object, const std::string& at, const char* key,
                            bool fallback) const {
    const json* v = Member(object, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean())
      return Error(Join(at, key), "is " + v->dump() + ", expected true or false");
    return v->get<bool>();
  }
  absl::StatusOr<std::string> String(const json& object, const std::string& at,
                                     const char* key) const {
    const json* v = Member(object, key);
    if (v == nullptr || !v->is_string()) {
      return Error(Join(at, key), v == nullptr ? "is missing, expected a string"
                                               : "is " + v->dump() + ", expected a string");
    }
    return v->get<std::string>();
  }
  absl::StatusOr<int> Count(const json& object, const std::string& at, const char* key) const {
    const json* v = Member(object, key);
    if (v == nullptr) return 0;
    if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > 1'000'000) {
      return Error(Join(at, key), "is " + v->dump() + ", expected a small count");
    }
    return static_cast<int>(v->get<int64_t>());
  }
  // The object's "type", which `object` (named `at`) must have.
  absl::StatusOr<std::string> Type(const json& object, const std::string& at) const {
    if (!object.is_object()) return Error(at, "is " + object.dump() + ", expected an object");
    return String(object, at, "type");
  }

  static std::string Join(const std::string& at, const std::string& key) {
    return at.empty() ? key : at + "." + key;
  }
  static std::string Index(const std::string& at, size_t i) {
    return absl::StrCat(at, "[", i, "]");
  }

 private:
  std::string path_;
};

// The members of a Sequence (`key` holds them) or the object itself, each with its field path.
absl::StatusOr<std::vector<std::pair<const json*, std::string>>> Flatten(const Fields& f,
                                                                         const json& object,
                                                                         const std::string& at,
                                                                         const char* key) {
  ASSIGN_OR_RETURN(const std::string type, f.Type(object, at));
  if (type != "Sequence") return std::vector<std::pair<const json*, std::string>>{{&object, at}};
  const json* list = Fields::Member(object, key);
  const std::string list_at = Fields::Join(at, key);
  if (list == nullptr || !list->is_array()) return f.Error(list_at, "is missing, expected a list");
  std::vector<std::pair<const json*, std::string>> out;
  for (size_t i = 0; i < list->size(); ++i) {
    ASSIGN_OR_RETURN(auto inner, Flatten(f, (*list)[i], Fields::Index(list_at, i), key));
    out.insert(out.end(), inner.begin(), inner.end());
  }
  return out;
}

// A Split or Replace pattern: {"String": s} or {"Regex": r}. Returns (text, is_regex).
absl::StatusOr<std::pair<std::string, bool>> Pattern(const Fields& f, const json& object,
                                                     const std::string& at) {
  const json* p = Fields::Member(object, "pattern");
  const std::string pat = Fields::Join(at, "pattern");
  if (p != nullptr && p->is_object() && p->size() == 1) {
    if (const json* s = Fields::Member(*p, "String"); s != nullptr && s->is_string()) {
      return std::make_pair(s->get<std::string>(), false);
    }
    if (const json* r = Fields::Member(*p, "Regex"); r != nullptr && r->is_string()) {
      return std::make_pair(r->get<std::string>(), true);
    }
  }
  return f.Error(pat, "is " + (p == nullptr ? std::string("missing") : p->dump()) +
                          ", expected {\"String\": ...} or {\"Regex\": ...}");
}

absl::StatusOr<PrependScheme> Prepend(const Fields& f, const json& object, const std::string& at) {
  PrependScheme scheme = PrependScheme::kAlways;
  if (const json* p = Fields::Member(object, "prepend_scheme"); p != nullptr) {
    if (*p == "always") {
      scheme = PrependScheme::kAlways;
    } else if (*p == "first") {
      scheme = PrependScheme::kFirst;
    } else if (*p == "never") {
      scheme = PrependScheme::kNever;
    } else {
      return f.Unsupported(Fields::Join(at, "prepend_scheme"), *p, "always, first or never");
    }
  }
  // Files written before prepend_scheme existed say add_prefix_space; false means never.
  ASSIGN_OR_RETURN(const bool add_prefix_space, f.Bool(object, at, "add_prefix_space", true));
  if (!add_prefix_space) scheme = PrependScheme::kNever;
  return scheme;
}

absl::StatusOr<std::string> OneCharacter(const Fields& f, const json& object, const std::string& at,
                                         const char* key) {
  ASSIGN_OR_RETURN(std::string s, f.String(object, at, key));
  if (s.empty() || Utf8SequenceLength(s, 0) != s.size()) {
    return f.Error(Fields::Join(at, key), "is " + Quote(s) + ", expected one character");
  }
  return s;
}

absl::Status ReadModel(const Fields& f, const json& root, BpePipeline& p) {
  const json* model = Fields::Member(root, "model");
  if (model == nullptr || !model->is_object()) return f.Error("model", "is missing");
  if (const json* type = Fields::Member(*model, "type"); type != nullptr && *type != "BPE") {
    return f.Unsupported("model.type", *type, "only BPE");
  }
  if (const json* dropout = Fields::Member(*model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return f.Error("model.dropout", "is " + dropout->dump() +
                                        ": BPE dropout (merges skipped at random) is not "
                                        "supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* affix = Fields::Member(*model, key); affix != nullptr && *affix != "") {
      return f.Unsupported(absl::StrCat("model.", key), *affix, "only null or \"\"");
    }
  }
  ASSIGN_OR_RETURN(p.byte_fallback, f.Bool(*model, "model", "byte_fallback", false));
  ASSIGN_OR_RETURN(p.fuse_unk, f.Bool(*model, "model", "fuse_unk", false));
  ASSIGN_OR_RETURN(p.ignore_merges, f.Bool(*model, "model", "ignore_merges", false));
  if (Fields::Member(*model, "unk_token") != nullptr) {
    ASSIGN_OR_RETURN(p.unk_token, f.String(*model, "model", "unk_token"));
  }
  const json* vocab = Fields::Member(*model, "vocab");
  if (vocab == nullptr) return f.Error("model.vocab", "is missing");
  p.vocab_where = f.path() + ": model.vocab";
  ASSIGN_OR_RETURN(p.vocab, VocabEntries(*vocab, p.vocab_where));

  if (const json* list = Fields::Member(*model, "merges"); list != nullptr) {
    if (!list->is_array()) return f.Error("model.merges", "is not a list");
    p.merges.reserve(list->size());
    for (size_t i = 0; i < list->size(); ++i) {
      const json& m = (*list)[i];
      const std::string where = absl::StrCat(f.path(), ": model.merges[", i, "]");
      if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        p.merges.push_back({m[0].get<std::string>(), m[1].get<std::string>(), where});
        continue;
      }
      const std::string s = m.is_string() ? m.get<std::string>() : std::string();
      const size_t space = s.find(' ');
      if (!m.is_string() || space == std::string::npos || space == 0 || space + 1 == s.size() ||
          s.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": expected \"a b\" or [\"a\", \"b\"], got ", m.dump()));
      }
      p.merges.push_back({s.substr(0, space), s.substr(space + 1), where});
    }
  }
  return absl::OkStatus();
}

absl::Status ReadNormalizer(const Fields& f, const json& root, BpePipeline& p) {
  const json* normalizer = Fields::Member(root, "normalizer");
  if (normalizer == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto parts, Flatten(f, *normalizer, "normalizer", "normalizers"));
  for (const auto& [n, at] : parts) {
    ASSIGN_OR_RETURN(const std::string type, f.Type(*n, at));
    BpePipeline::Normalizer out;
    out.where = f.path() + ": " + at;
    if (type == "Prepend") {
      out.kind = BpePipeline::Normalizer::Kind::kPrepend;
      ASSIGN_OR_RETURN(out.text, f.String(*n, at, "prepend"));
    } else if (type == "Replace") {
      out.kind = BpePipeline::Normalizer::Kind::kReplace;
      ASSIGN_OR_RETURN(std::tie(out.text, out.regex), Pattern(f, *n, at));
      ASSIGN_OR_RETURN(out.content, f.String(*n, at, "content"));
    } else {
      return f.Unsupported(at + ".type", type, "only Sequence, Prepend and Replace");
    }
    p.normalizers.push_back(std::move(out));
  }
  return absl::OkStatus();
}

absl::Status ReadPreTokenizer(const Fields& f, const json& root, BpePipeline& p) {
  const json* pre = Fields::Member(root, "pre_tokenizer");
  if (pre == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto parts, Flatten(f, *pre, "pre_tokenizer", "pretokenizers"));
  for (size_t k = 0; k < parts.size(); ++k) {
    const auto& [t, at] = parts[k];
    ASSIGN_OR_RETURN(const std::string type, f.Type(*t, at));
    BpePipeline::PreTokenizer out;
    out.where = f.path() + ": " + at;
    if (type == "Split") {
      out.kind = BpePipeline::PreTokenizer::Kind::kSplit;
      ASSIGN_OR_RETURN(std::tie(out.pattern, out.regex), Pattern(f, *t, at));
      ASSIGN_OR_RETURN(out.invert, f.Bool(*t, at, "invert", false));
      ASSIGN_OR_RETURN(const std::string behavior, f.String(*t, at, "behavior"));
      static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
          {"Removed", SplitBehavior::kRemoved},
          {"Isolated", SplitBehavior::kIsolated},
          {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
          {"MergedWithNext", SplitBehavior::kMergedWithNext},
          {"Contiguous", SplitBehavior::kContiguous}};
      const auto it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                                   [&](const auto& b) { return behavior == b.first; });
      if (it == std::end(kBehaviors)) {
        return f.Unsupported(at + ".behavior", behavior,
                             "Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous");
      }
      out.behavior = it->second;
    } else if (type == "Metaspace") {
      out.kind = BpePipeline::PreTokenizer::Kind::kMetaspace;
      ASSIGN_OR_RETURN(out.replacement, OneCharacter(f, *t, at, "replacement"));
      ASSIGN_OR_RETURN(out.prepend_scheme, Prepend(f, *t, at));
      ASSIGN_OR_RETURN(out.split, f.Bool(*t, at, "split", true));
    } else if (type == "ByteLevel") {
      out.kind = BpePipeline::PreTokenizer::Kind::kByteLevel;
      // `tokenizers`' defaults for a field the file leaves out.
      ASSIGN_OR_RETURN(out.add_prefix_space, f.Bool(*t, at, "add_prefix_space", true));
      ASSIGN_OR_RETURN(out.use_regex, f.Bool(*t, at, "use_regex", true));
      if (k + 1 != parts.size()) {
        return f.Error(at,
                       "is ByteLevel before other pre-tokenizers, which is not supported (they "
                       "would see its byte characters; only a last ByteLevel is)");
      }
    } else {
      return f.Unsupported(at + ".type", type, "only Sequence, Split, Metaspace and ByteLevel");
    }
    p.pre_tokenizers.push_back(std::move(out));
  }
  return absl::OkStatus();
}

absl::Status ReadDecoder(const Fields& f, const json& root, BpePipeline& p) {
  const json* decoder = Fields::Member(root, "decoder");
  if (decoder == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto parts, Flatten(f, *decoder, "decoder", "decoders"));
  p.decoders.emplace();
  for (const auto& [d, at] : parts) {
    ASSIGN_OR_RETURN(const std::string type, f.Type(*d, at));
    BpePipeline::Decoder out{};
    if (type == "ByteLevel") {
      out.kind = BpePipeline::Decoder::Kind::kByteLevel;
    } else if (type == "Metaspace") {
      out.kind = BpePipeline::Decoder::Kind::kMetaspace;
      ASSIGN_OR_RETURN(out.replacement, OneCharacter(f, *d, at, "replacement"));
      ASSIGN_OR_RETURN(out.prepend_scheme, Prepend(f, *d, at));
    } else if (type == "Replace") {
      out.kind = BpePipeline::Decoder::Kind::kReplace;
      bool regex = false;
      ASSIGN_OR_RETURN(std::tie(out.pattern, regex), Pattern(f, *d, at));
      if (regex) {
        return f.Error(at + ".pattern",
                       "is a Regex, which a Replace decoder does not support "
                       "(only a String)");
      }
      ASSIGN_OR_RETURN(out.content, f.String(*d, at, "content"));
    } else if (type == "ByteFallback") {
      out.kind = BpePipeline::Decoder::Kind::kByteFallback;
    } else if (type == "Fuse") {
      out.kind = BpePipeline::Decoder::Kind::kFuse;
    } else if (type == "Strip") {
      out.kind = BpePipeline::Decoder::Kind::kStrip;
      ASSIGN_OR_RETURN(out.content, OneCharacter(f, *d, at, "content"));
      ASSIGN_OR_RETURN(out.start, f.Count(*d, at, "start"));
      ASSIGN_OR_RETURN(out.stop, f.Count(*d, at, "stop"));
    } else {
      return f.Unsupported(at + ".type", type,
                           "only Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse and "
                           "Strip");
    }
    p.decoders->push_back(std::move(out));
  }
  return absl::OkStatus();
}

// `tokenizers` does not take an added token's id from the file: it gives the token the id its
// content already has (in the model's vocabulary or among the added tokens before it), else the
// next one after the vocabulary's size and the added ids. Ids that disagree with that are refused
// rather than followed one way or the other.
absl::Status ReadAddedTokens(const Fields& f, const json& root, BpePipeline& p) {
  const json* added = Fields::Member(root, "added_tokens");
  if (added == nullptr) return absl::OkStatus();
  if (!added->is_array()) return f.Error("added_tokens", "is not a list");
  absl::flat_hash_map<std::string, Token> known;
  for (const auto& [token, id] : p.vocab) known.emplace(token, id);
  Token next_id = static_cast<Token>(p.vocab.size());
  for (size_t i = 0; i < added->size(); ++i) {
    const json& t = (*added)[i];
    const std::string at = Fields::Index("added_tokens", i);
    const json* id = Fields::Member(t, "id");
    const json* content = Fields::Member(t, "content");
    if (id == nullptr || !IsTokenId(*id) || content == nullptr || !content->is_string() ||
        content->get<std::string>().empty()) {
      return f.Error(at, absl::StrCat("is ", t.dump(), ": expected an object with an id in [0, ",
                                      kMaxTokenId, "] and a non-empty content"));
    }
    BpePipeline::AddedToken out;
    out.content = content->get<std::string>();
    out.id = static_cast<Token>(id->get<int64_t>());
    ASSIGN_OR_RETURN(out.special, f.Bool(t, at, "special", false));
    ASSIGN_OR_RETURN(out.normalized, f.Bool(t, at, "normalized", !out.special));
    ASSIGN_OR_RETURN(out.lstrip, f.Bool(t, at, "lstrip", false));
    ASSIGN_OR_RETURN(out.rstrip, f.Bool(t, at, "rstrip", false));
    ASSIGN_OR_RETURN(out.single_word, f.Bool(t, at, "single_word", false));
    const auto [it, is_new] = known.emplace(out.content, next_id);
    if (is_new) ++next_id;
    if (it->second != out.id) {
      return f.Error(at, absl::StrCat("has id ", out.id, " but `tokenizers` gives ",
                                      Quote(out.content), " id ", it->second,
                                      is_new ? " (the next free id)" : " (its id already)"));
    }
    p.added_tokens.push_back(std::move(out));
  }
  return absl::OkStatus();
}

// The ids of the special tokens a post-processor names (TemplateProcessing's special_tokens).
absl::Status ReadTemplate(const Fields& f, const json& processor, const std::string& at,
                          BpePipeline& p) {
  const json* single = Fields::Member(processor, "single");
  if (single == nullptr || !single->is_array()) {
    return f.Error(at + ".single", "is missing, expected a template list");
  }
  const json* specials = Fields::Member(processor, "special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& piece = (*single)[i];
    const std::string piece_at = Fields::Index(at + ".single", i);
    if (const json* seq = Fields::Member(piece, "Sequence"); seq != nullptr) {
      if (Fields::Member(*seq, "id") == nullptr || (*seq)["id"] != "A" || seen_sequence) {
        return f.Error(piece_at, "is " + piece.dump() + ", expected the one sequence, A");
      }
      seen_sequence = true;
      continue;
    }
    const json* special = Fields::Member(piece, "SpecialToken");
    const json* name = special == nullptr ? nullptr : Fields::Member(*special, "id");
    if (name == nullptr || !name->is_string()) {
      return f.Error(piece_at, "is " + piece.dump() + ", expected a Sequence or a SpecialToken");
    }
    const json* entry =
        specials == nullptr ? nullptr : Fields::Member(*specials, name->get<std::string>().c_str());
    const json* ids = entry == nullptr ? nullptr : Fields::Member(*entry, "ids");
    if (ids == nullptr || !ids->is_array() ||
        !std::all_of(ids->begin(), ids->end(), [](const json& id) { return IsTokenId(id); })) {
      return f.Error(at + ".special_tokens",
                     absl::StrCat("has no ids for ", Quote(name->get<std::string>()), ", which ",
                                  piece_at, " names"));
    }
    for (const json& id : *ids) {
      (seen_sequence ? p.suffix : p.prefix).push_back(static_cast<Token>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) return f.Error(at + ".single", "has no Sequence A");
  return absl::OkStatus();
}

absl::Status ReadPostProcessor(const Fields& f, const json& root, BpePipeline& p) {
  const json* processor = Fields::Member(root, "post_processor");
  if (processor == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto parts, Flatten(f, *processor, "post_processor", "processors"));
  for (const auto& [q, at] : parts) {
    ASSIGN_OR_RETURN(const std::string type, f.Type(*q, at));
    if (type == "ByteLevel") continue;  // offsets only
    if (!p.prefix.empty() || !p.suffix.empty()) {
      return f.Error(at, "is a second processor that adds special tokens, which is not supported");
    }
    if (type == "TemplateProcessing") {
      RETURN_IF_ERROR(ReadTemplate(f, *q, at, p));
    } else if (type == "BertProcessing" || type == "RobertaProcessing") {
      // [CLS] A [SEP], each given as [token, id].
      for (const char* key : {"cls", "sep"}) {
        const json* pair = Fields::Member(*q, key);
        if (pair == nullptr || !pair->is_array() || pair->size() != 2 || !IsTokenId((*pair)[1])) {
          return f.Error(Fields::Join(at, key), "is missing, expected [token, id]");
        }
        (std::string(key) == "cls" ? p.prefix : p.suffix)
            .push_back(static_cast<Token>((*pair)[1].get<int64_t>()));
      }
    } else {
      return f.Unsupported(at + ".type", type,
                           "only Sequence, TemplateProcessing, BertProcessing, RobertaProcessing "
                           "and ByteLevel");
    }
  }
  return absl::OkStatus();
}

// The id of the token whose text is `text`: an added token's, else the vocabulary's.
std::optional<Token> IdOf(const BpePipeline& p, const std::string& text) {
  for (const BpePipeline::AddedToken& a : p.added_tokens) {
    if (a.content == text) return a.id;
  }
  for (const auto& [token, id] : p.vocab) {
    if (token == text) return id;
  }
  return std::nullopt;
}

Token VocabSize(const BpePipeline& p) {
  Token size = 0;
  for (const auto& [token, id] : p.vocab) size = std::max(size, id + 1);
  for (const BpePipeline::AddedToken& a : p.added_tokens) size = std::max(size, a.id + 1);
  return size;
}

// Reads `name` of the folder `dir` into `json`; false when it is not there.
absl::StatusOr<bool> ReadOptional(const stdfs::path& dir, const char* name, json* out) {
  const std::string path = (dir / name).string();
  std::error_code ec;
  if (!stdfs::exists(path, ec)) return false;
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  ASSIGN_OR_RETURN(*out, ParseJson(path, text));
  if (!out->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a JSON object"));
  }
  return true;
}

// tokenizer_config.json and generation_config.json beside the tokenizer.json: bos_token,
// eos_token, add_bos_token, add_eos_token; eos_token_id, bos_token_id.
absl::Status ReadSpecialTokens(const stdfs::path& dir, BpePipeline& p) {
  const Token size = VocabSize(p);
  std::optional<Token> bos, eos;
  json config;
  ASSIGN_OR_RETURN(const bool has_config, ReadOptional(dir, "tokenizer_config.json", &config));
  const Fields cf((dir / "tokenizer_config.json").string());
  std::optional<bool> add_bos, add_eos;
  if (has_config) {
    for (const char* key : {"bos_token", "eos_token"}) {
      const json* v = Fields::Member(config, key);
      if (v == nullptr) continue;
      // A string, or an AddedToken written out ({"__type": "AddedToken", "content": ...}).
      const json* content = v->is_object() ? Fields::Member(*v, "content") : v;
      if (content == nullptr || !content->is_string()) {
        return cf.Error(key, "is " + v->dump() + ", expected a string or {\"content\": ...}");
      }
      const std::optional<Token> id = IdOf(p, content->get<std::string>());
      if (!id) {
        return cf.Error(key, absl::StrCat("is ", Quote(content->get<std::string>()),
                                          ", which is not a token of ", p.source));
      }
      (std::string(key) == "bos_token" ? bos : eos) = id;
    }
    for (const auto& [key, flag] :
         {std::pair<const char*, std::optional<bool>*>{"add_bos_token", &add_bos},
          {"add_eos_token", &add_eos}}) {
      if (Fields::Member(config, key) != nullptr) {
        ASSIGN_OR_RETURN(*flag, cf.Bool(config, "", key, false));
      }
    }
  }

  json generation;
  ASSIGN_OR_RETURN(const bool has_generation,
                   ReadOptional(dir, "generation_config.json", &generation));
  const Fields gf((dir / "generation_config.json").string());
  std::vector<Token> eos_ids;
  if (has_generation) {
    const auto id_at = [&](const json& v, const std::string& at) -> absl::StatusOr<Token> {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= size) {
        return gf.Error(at, absl::StrCat("is ", v.dump(), ", not an id of the ", size,
                                         " tokens of ", p.source));
      }
      return static_cast<Token>(v.get<int64_t>());
    };
    if (const json* v = Fields::Member(generation, "eos_token_id"); v != nullptr) {
      if (v->is_array()) {
        for (size_t i = 0; i < v->size(); ++i) {
          ASSIGN_OR_RETURN(const Token id, id_at((*v)[i], Fields::Index("eos_token_id", i)));
          eos_ids.push_back(id);
        }
      } else {
        ASSIGN_OR_RETURN(const Token id, id_at(*v, "eos_token_id"));
        eos_ids.push_back(id);
      }
    }
    if (const json* v = Fields::Member(generation, "bos_token_id"); v != nullptr && !bos) {
      ASSIGN_OR_RETURN(bos, id_at(*v, "bos_token_id"));
    }
  }

  if (add_bos) {
    if (*add_bos && !bos) {
      return cf.Error("add_bos_token",
                      "is true but neither tokenizer_config.json's bos_token nor "
                      "generation_config.json's bos_token_id names the token");
    }
    p.prefix = *add_bos ? std::vector<Token>{*bos} : std::vector<Token>{};
  }
  if (add_eos) {
    const std::optional<Token> end =
        eos ? eos : (eos_ids.empty() ? std::nullopt : std::optional(eos_ids[0]));
    if (*add_eos && !end) {
      return cf.Error("add_eos_token", "is true but no eos_token names the token");
    }
    p.suffix = *add_eos ? std::vector<Token>{*end} : std::vector<Token>{};
  }

  if (eos) {
    p.eot = eos;
  } else if (!eos_ids.empty()) {
    p.eot = eos_ids[0];
  } else {
    p.eot = IdOf(p, std::string(BpeTokenizer::kEndOfText));
  }
  p.stop_tokens = eos_ids;
  if (p.eot && std::find(eos_ids.begin(), eos_ids.end(), *p.eot) == eos_ids.end()) {
    p.stop_tokens.push_back(*p.eot);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BpePipeline> ReadTokenizerJson(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  ASSIGN_OR_RETURN(const json root, ParseJson(path, text));
  const Fields f(path);
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected a JSON object, got ", root.type_name()));
  }
  for (const char* key : {"truncation", "padding"}) {
    if (const json* v = Fields::Member(root, key); v != nullptr) {
      return f.Error(key, "is " + v->dump() +
                              ", which is not supported (only null: it would "
                              "change what one text encodes to)");
    }
  }
  BpePipeline p;
  p.source = path;
  RETURN_IF_ERROR(ReadModel(f, root, p));
  RETURN_IF_ERROR(ReadNormalizer(f, root, p));
  RETURN_IF_ERROR(ReadPreTokenizer(f, root, p));
  RETURN_IF_ERROR(ReadDecoder(f, root, p));
  RETURN_IF_ERROR(ReadAddedTokens(f, root, p));
  RETURN_IF_ERROR(ReadPostProcessor(f, root, p));
  const Token size = VocabSize(p);
  for (const Token id : p.prefix) {
    if (id >= size)
      return f.Error("post_processor",
                     absl::StrCat("names id ", id, ", past the ", size, " tokens"));
  }
  for (const Token id : p.suffix) {
    if (id >= size)
      return f.Error("post_processor",
                     absl::StrCat("names id ", id, ", past the ", size, " tokens"));
  }
  RETURN_IF_ERROR(ReadSpecialTokens(stdfs::path(path).parent_path(), p));
  return p;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadTokenizerJson(const std::string& path) {
  ASSIGN_OR_RETURN(BpePipeline pipeline, ReadTokenizerJson(path));
  return BpeTokenizer::Create(std::move(pipeline));
}

}  // namespace shardline::data
