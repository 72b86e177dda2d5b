// The edge-case corpus the tokenizer reference tests hold our tokenizers against Hugging Face's
// `tokenizers` with (data_gpt2_tokenizer_reference_test, data_hf_tokenizer_reference_test):
// contractions, numbers, whitespace runs, emoji, CJK and other scripts, combining marks,
// punctuation, code, the special token, long words, and seeded random Unicode text. All of it is
// valid UTF-8 (what `tokenizers` can take); InvalidUtf8Pieces are the ill-formed sequences the
// tests put into it.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace shardline::testing {

inline void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Random text from blocks whose letters, digits, marks and spaces are the same in PCRE2's Unicode
// 14 and `tokenizers`' newer tables (bpe_tokenizer.h says why that matters): mostly ASCII words
// and spaces, with every script of the hand-written corpus, marks, emoji, ZWJ and digits mixed in.
inline std::string RandomUnicodeText(std::mt19937& rng, size_t chars) {
  struct Range {
    uint32_t first, last;
    int weight;
  };
  static const Range kRanges[] = {
      {'a', 'z', 30},        {'A', 'Z', 6},         {'0', '9', 4},         {' ', ' ', 18},
      {'!', '/', 3},         {':', '@', 2},         {'\'', '\'', 2},       {'\n', '\n', 2},
      {'\t', '\t', 1},       {0xA0, 0xA0, 1},       {0xA1, 0xFF, 2},       {0x100, 0x17F, 2},
      {0x300, 0x36F, 2},     {0x3B1, 0x3C9, 2},     {0x410, 0x44F, 3},     {0x5D0, 0x5EA, 1},
      {0x621, 0x64A, 2},     {0x64B, 0x652, 1},     {0x660, 0x669, 1},     {0x905, 0x939, 2},
      {0x93E, 0x94D, 1},     {0x966, 0x96F, 1},     {0xE01, 0xE2E, 1},     {0x2000, 0x200A, 1},
      {0x200B, 0x200D, 1},   {0x2010, 0x2027, 1},   {0x2028, 0x2029, 1},   {0x2200, 0x22FF, 1},
      {0x2500, 0x257F, 1},   {0x3000, 0x3000, 1},   {0x3041, 0x3096, 2},   {0x30A1, 0x30FA, 2},
      {0x4E00, 0x9FA5, 4},   {0xAC00, 0xD7A3, 2},   {0xFE0F, 0xFE0F, 1},   {0xFF10, 0xFF19, 1},
      {0x1F300, 0x1F5FF, 2}, {0x1F600, 0x1F64F, 2}, {0x1F3FB, 0x1F3FF, 1}, {0x180E, 0x180E, 1},
  };
  std::vector<int> weights;
  for (const Range& r : kRanges) weights.push_back(r.weight);
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  std::string text;
  for (size_t i = 0; i < chars; ++i) {
    const Range& r = kRanges[pick(rng)];
    AppendUtf8(r.first + static_cast<uint32_t>(rng() % (r.last - r.first + 1)), text);
  }
  return text;
}

inline std::vector<std::string> TokenizerCorpus() {
  std::vector<std::string> corpus = {
      "",
      "a",
      " ",
      "Hello world",
      "Hello, World!",
      "hello  world",
      "The quick brown fox jumps "
      "over the lazy dog.",
      // contractions, upper case ones are not contractions to the regex
      "don't",
      "I'm",
      "you're",
      "they've",
      "we'll",
      "he'd",
      "it's",
      "IT'S",
      "DON'T",
      "I'M",
      "'S",
      "'s",
      "'s'll",
      "rock 'n' roll",
      "''",
      "O'Neil's",
      "can't've",
      "y'all'd've",
      " 're",
      "x'  s",
      "Don\u2019t",
      // numbers and digit runs
      "123",
      "1234567890",
      "3.14159",
      "1,000,000",
      "  42",
      "x2",
      "2x",
      "0.5%",
      "$100",
      "v1.2.3",
      "12345678901234567890123",
      "\u0663\u0664\u0665",
      "\u00bd \u2154",
      "\u2460\u2461",
      "\u0967\u0968\u0969",
      "\u216b",
      "\uff11\uff12\uff13",
      // whitespace runs
      "   ",
      "a   b",
      "trailing   ",
      "\n",
      "\n\n\n",
      "line\nline\n",
      "tab\tsep\t\t",
      " \t \n ",
      "\r\n",
      "a\r\n\r\nb",
      "\u00a0nbsp",
      "\u3000ideographic",
      "a\u2028b\u2029c",
      "\u0085\u0085a",
      "x\u0085 y",
      "\u180e\u180ea",
      "a \u180eb",
      "\u200b zero width",
      "\ufeffbom",
      "x\x0b\x0cy",
      "\t\n\x0b\x0c\r \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
      "\u2009\u200a\u2028\u2029\u202f\u205f\u3000z",
      "   leading",
      "end with space ",
      "end with spaces    ",
      "two\n\n  paragraphs\n",
      "a \n b",
      "word\t",
      "    indented code\n        more\n",
      // emoji, ZWJ sequences, flags, keycaps, skin tones
      "\U0001F44D",
      "\U0001F44D\U0001F3FD",
      "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D"
      "\U0001F466",
      "\U0001F3F3\uFE0F\u200D\U0001F308",
      "\U0001F1EF\U0001F1F5\U0001F1FA\U0001F1F8",
      "\u2764\uFE0F",
      "Hi \U0001F600\U0001F603\U0001F604!",
      "1\uFE0F\u20E3",
      " \U0001F600 x",
      // CJK, Korean, Arabic, Devanagari, other scripts
      "\u4f60\u597d\uff0c\u4e16\u754c",
      "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
      "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
      "\u4e2d\u6587 English mixed \u6df7\u5408",
      "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
      "\u0627\u0644\u0633\u064e\u0651\u0644\u064e\u0627\u0645\u064f "
      "\u0639\u064e\u0644\u064e\u064a\u0652\u0643\u064f\u0645\u0652",
      "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
      "\u0939\u093f\u0928\u094d\u0926\u0940",
      "\u05e9\u05dc\u05d5\u05dd",
      "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
      "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
      "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1",
      // combining marks
      "e\u0301",
      "cafe\u0301",
      "a\u0308\u0301",
      " \u0301",
      "Z\u0324\u0354\u0367\u0311\u0313a"
      "\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u031ao",
      "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
      // punctuation runs
      "!!!???",
      "...",
      "---",
      "a--b",
      "(x)",
      "[]{}<>",
      "@#$%^&*",
      "\u201cquotes\u201d",
      "\u00ab\u00bb",
      "a\u2014b",
      "!!! ??? ...",
      " !!!",
      "?!\n",
      "#hashtag @user",
      "~/.bashrc",
      // code and URLs
      "def f(x):\n    return x**2\n",
      "if (a && b) { c++; }",
      "https://example.com/path?q=1&r=2",
      "email@example.com",
      "<html><body>hi</body></html>",
      "{\"key\": [1, 2, 3]}",
      // the special token, whole, repeated, broken and surrounded
      "<|endoftext|>",
      "a<|endoftext|>b",
      "<|endoftext|><|endoftext|>",
      " <|endoftext|> ",
      "<|endoftext|",
      "<|endoftext|>>",
      "<<|endoftext|>",
      "text.<|endoftext|>\n\nNext doc",
      "<|endoftext|> The",
      "x <|endoftext|>",
      // repeated text (the cache) and long words
      "the the the the the the the the",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
      std::string(300, ' ') + "x",
      std::string(200, '\n'),
      std::string(150, '!'),
  };
  std::mt19937 rng(20240611);
  for (int i = 0; i < 60; ++i) corpus.push_back(RandomUnicodeText(rng, 1 + rng() % 400));
  corpus.push_back(RandomUnicodeText(rng, 50000));
  return corpus;
}

// Ill-formed UTF-8: lone continuation bytes, overlong forms, surrogates, past U+10FFFF, bytes
// that never occur, truncated sequences.
inline std::vector<std::string> InvalidUtf8Pieces() {
  return {
      "\x80",         "\xbf",         "\xc0\x80",         "\xc1\xbf",         "\xe0\x80\x80",
      "\xed\xa0\x80", "\xed\xbf\xbf", "\xf0\x80\x80\x80", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80",
      "\xff",         "\xfe",         "\xe2\x82",         "\xf0\x9f\x98",     "\xc3",
      "\xe2\x28\xa1", "\xc3\x28"};
}

}  // namespace shardline::testing
