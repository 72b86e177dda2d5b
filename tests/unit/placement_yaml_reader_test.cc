#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "placement/byte_size.h"
#include "placement/yaml_reader.h"

namespace shardline::placement {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

absl::StatusOr<YamlMap> Open(const std::string& text, std::vector<std::string_view> keys) {
  return YamlMap::Parse(text, "test.yaml", std::move(keys));
}

enum class Color { kRed, kGreen };
constexpr EnumName<Color> kColors[] = {{"red", Color::kRed}, {"green", Color::kGreen}};

TEST(YamlReaderTest, ErrorHasFileLineColumnPathAndMessage) {
  // The value "lots" starts at line 3, column 14.
  const std::string text =
      "name: x\n"
      "limits:\n"
      "  max_count:  lots\n";
  auto root = Open(text, {"name", "limits"});
  ASSERT_TRUE(root.ok()) << root.status();
  auto limits = root->RequiredMap("limits", {"max_count"});
  ASSERT_TRUE(limits.ok()) << limits.status();
  auto value = limits->RequiredInt64("max_count");
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(value.status()),
            "test.yaml:3:15: limits.max_count: expected an integer, got 'lots'");
}

TEST(YamlReaderTest, UnknownKeyNamesKeyLineSuggestionAndKnownKeys) {
  auto map = Open("name: a\nactor: 3\n", {"name", "actors", "devices"});
  ASSERT_FALSE(map.ok());
  const std::string message = Message(map.status());
  EXPECT_THAT(message, HasSubstr("test.yaml:2:1: actor: unknown key 'actor'"));
  EXPECT_THAT(message, HasSubstr("did you mean 'actors'?"));
  EXPECT_THAT(message, HasSubstr("known keys: name, actors, devices"));
}

TEST(YamlReaderTest, UnknownKeyFarFromAllKnownKeysHasNoSuggestion) {
  auto map = Open("zzzzzz: 1\n", {"name", "kind"});
  ASSERT_FALSE(map.ok());
  EXPECT_THAT(Message(map.status()), Not(HasSubstr("did you mean")));
  EXPECT_THAT(Message(map.status()), HasSubstr("unknown key 'zzzzzz'"));
}

TEST(YamlReaderTest, UnknownNestedKeyHasDottedPath) {
  auto root = Open("outer:\n  min_byte: 4\n", {"outer"});
  ASSERT_TRUE(root.ok()) << root.status();
  auto inner = root->OptionalMap("outer", {"min_bytes", "max_bytes"});
  ASSERT_FALSE(inner.ok());
  EXPECT_THAT(Message(inner.status()),
              HasSubstr("test.yaml:2:3: outer.min_byte: unknown key 'min_byte' in outer; did you "
                        "mean 'min_bytes'?"));
}

TEST(YamlReaderTest, DuplicateKeyIsAnError) {
  auto map = Open("a: 1\nb: 2\na: 3\n", {"a", "b"});
  ASSERT_FALSE(map.ok());
  EXPECT_THAT(Message(map.status()),
              HasSubstr("test.yaml:3:1: a: key 'a' appears twice (first at line 1)"));
}

TEST(YamlReaderTest, NonMappingDocumentIsAnError) {
  auto list = Open("- a\n- b\n", {"a"});
  ASSERT_FALSE(list.ok());
  EXPECT_THAT(Message(list.status()), HasSubstr("expected a mapping with keys: a; got a list"));

  auto empty = Open("", {"a", "b"});
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(
      Message(empty.status()),
      HasSubstr("test.yaml:1:1: the document is empty; expected a mapping with keys: a, b"));
}

TEST(YamlReaderTest, SyntaxErrorBecomesInvalidArgumentWithLine) {
  auto map = Open("a: 1\nb: [1, 2\nc: 3\n", {"a", "b", "c"});
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(map.status()), HasSubstr("test.yaml:"));
  EXPECT_THAT(Message(map.status()), HasSubstr("invalid YAML"));

  auto tabs = Open("a: 1\n\tb: 2\n", {"a", "b"});
  ASSERT_FALSE(tabs.ok());
  EXPECT_THAT(Message(tabs.status()), HasSubstr("test.yaml:2:"));
}

TEST(YamlReaderTest, SecondDocumentIsAnError) {
  auto map = Open("a: 1\n---\na: 2\n", {"a"});
  ASSERT_FALSE(map.ok());
  EXPECT_THAT(Message(map.status()), HasSubstr("expected one document, found 2"));
  EXPECT_THAT(Message(map.status()), HasSubstr("test.yaml:3:"));
}

TEST(YamlReaderTest, MissingRequiredKeyNamesIt) {
  auto map = Open("a: 1\n", {"a", "b"});
  ASSERT_TRUE(map.ok()) << map.status();
  auto b = map->RequiredInt64("b");
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(Message(b.status()), HasSubstr("test.yaml:1:1: b: required key 'b' is missing"));
}

TEST(YamlReaderTest, IntegersAndRanges) {
  auto map = Open("zero: 0\nbig: 5000\nneg: -3\nfloat: 1.5\nhuge: 99999999999999999999\n",
                  {"zero", "big", "neg", "float", "huge", "absent"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(*map->RequiredInt64("neg"), -3);
  EXPECT_EQ(*map->OptionalInt64("absent", 7, {.min = 1}), 7);

  EXPECT_THAT(Message(map->RequiredInt64("zero", {.min = 1}).status()),
              HasSubstr("test.yaml:1:7: zero: must be ≥ 1, got 0"));
  EXPECT_THAT(Message(map->RequiredInt64("big", {.max = 1000}).status()),
              HasSubstr("big: must be ≤ 1000, got 5000"));
  EXPECT_THAT(Message(map->RequiredInt64("big", {.min = 1, .max = 1000}).status()),
              HasSubstr("big: must be between 1 and 1000, got 5000"));
  EXPECT_THAT(Message(map->RequiredInt64("float").status()),
              HasSubstr("float: expected an integer, got '1.5'"));
  EXPECT_THAT(Message(map->RequiredInt64("huge").status()), HasSubstr("out of the 64-bit range"));
}

TEST(YamlReaderTest, Doubles) {
  auto map = Open("zero: 0\nhalf: 0.5\ninf: .inf\nword: soon\nint: 30\n",
                  {"zero", "half", "inf", "word", "int"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_DOUBLE_EQ(*map->RequiredDouble("half"), 0.5);
  EXPECT_DOUBLE_EQ(*map->RequiredDouble("int"), 30.0);
  EXPECT_THAT(Message(map->RequiredDouble("zero", {.min = 0, .min_exclusive = true}).status()),
              HasSubstr("zero: must be > 0, got 0"));
  EXPECT_THAT(Message(map->RequiredDouble("half", {.min = 1}).status()),
              HasSubstr("half: must be ≥ 1, got 0.5"));
  EXPECT_THAT(Message(map->RequiredDouble("inf").status()),
              HasSubstr("expected a finite number, got '.inf'"));
  EXPECT_THAT(Message(map->RequiredDouble("word").status()),
              HasSubstr("expected a finite number, got 'soon'"));
}

TEST(YamlReaderTest, BooleansAreStrict) {
  auto map = Open("a: true\nb: False\nc: yes\nd: 1\n", {"a", "b", "c", "d"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_TRUE(*map->RequiredBool("a"));
  EXPECT_FALSE(*map->RequiredBool("b"));
  EXPECT_THAT(Message(map->RequiredBool("c").status()),
              HasSubstr("test.yaml:3:4: c: expected true or false, got 'yes'"));
  EXPECT_FALSE(map->RequiredBool("d").ok());
  EXPECT_TRUE(*map->OptionalBool("absent", true));
}

TEST(YamlReaderTest, StringsAndWrongShapes) {
  auto map = Open("s: hello\nn: 123\nlist: [1]\nmapping: {a: 1}\nempty:\n",
                  {"s", "n", "list", "mapping", "empty"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(*map->RequiredString("s"), "hello");
  EXPECT_EQ(*map->RequiredString("n"), "123");
  EXPECT_EQ(*map->OptionalString("absent", "dflt"), "dflt");
  EXPECT_THAT(Message(map->RequiredString("list").status()),
              HasSubstr("test.yaml:3:7: list: expected a string, got a list"));
  EXPECT_THAT(Message(map->RequiredString("mapping").status()),
              HasSubstr("mapping: expected a string, got a mapping"));
  // `key:` with no value is a mistake, even for an optional key: it must not fall back silently.
  const absl::Status empty = map->OptionalString("empty", "dflt").status();
  EXPECT_THAT(Message(empty), HasSubstr("test.yaml:5:1:"));
  EXPECT_THAT(Message(empty), HasSubstr("empty: expected a string, got nothing (null)"));
}

TEST(YamlReaderTest, EnumsListAllowedValuesAndSuggest) {
  auto map = Open("color: gren\nok: red\n", {"color", "ok"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(*map->RequiredEnum<Color>("ok", kColors), Color::kRed);
  EXPECT_EQ(*map->OptionalEnum("absent", kColors, Color::kGreen), Color::kGreen);
  EXPECT_THAT(Message(map->RequiredEnum<Color>("color", kColors).status()),
              HasSubstr("test.yaml:1:8: color: expected one of 'red', 'green', got 'gren'; did "
                        "you mean 'green'?"));
}

TEST(YamlReaderTest, StringListsCheckEachElement) {
  const std::string text =
      "ops: [alpha, beta]\n"
      "bad:\n"
      "  - alpha\n"
      "  - betta\n"
      "nested: [a, [b]]\n"
      "scalar: a\n";
  auto map = Open(text, {"ops", "bad", "nested", "scalar"});
  ASSERT_TRUE(map.ok()) << map.status();
  const std::string_view allowed[] = {"alpha", "beta"};
  EXPECT_EQ(*map->RequiredStringList("ops", allowed), (std::vector<std::string>{"alpha", "beta"}));
  EXPECT_TRUE(map->OptionalStringList("absent")->empty());
  EXPECT_THAT(Message(map->RequiredStringList("bad", allowed).status()),
              HasSubstr("test.yaml:4:5: bad[1]: expected one of 'alpha', 'beta', got 'betta'; did "
                        "you mean 'beta'?"));
  EXPECT_THAT(Message(map->RequiredStringList("nested").status()),
              HasSubstr("nested[1]: expected a string, got a list"));
  EXPECT_THAT(Message(map->RequiredStringList("scalar").status()),
              HasSubstr("scalar: expected a list (e.g. [a, b]), got 'a'"));
}

TEST(YamlReaderTest, AbsentOptionalMapGivesDefaults) {
  auto map = Open("a: 1\n", {"a", "sub"});
  ASSERT_TRUE(map.ok()) << map.status();
  auto sub = map->OptionalMap("sub", {"x"});
  ASSERT_TRUE(sub.ok()) << sub.status();
  EXPECT_EQ(sub->path(), "sub");
  EXPECT_FALSE(sub->Has("x"));
  EXPECT_EQ(*sub->OptionalInt64("x", 42), 42);
  EXPECT_FALSE(map->RequiredMap("sub", {"x"}).ok());
}

TEST(YamlReaderTest, NestedKeyWithoutValueIsAnError) {
  auto map = Open("a: 1\nsub:\n", {"a", "sub"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_THAT(Message(map->OptionalMap("sub", {"x"}).status()),
              HasSubstr("test.yaml:2:1: sub: has no value; expected a mapping with keys: x"));
}

TEST(YamlReaderTest, LargeDoubleBoundsPrintWithoutExponent) {
  auto map = Open("t: 40000000\n", {"t"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_THAT(Message(map->RequiredDouble("t", {.max = 31536000}).status()),
              HasSubstr("t: must be ≤ 31536000, got 40000000"));
}

TEST(YamlReaderTest, NestedValueThatIsNotAMapping) {
  auto map = Open("sub: 3\n", {"sub"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_THAT(Message(map->OptionalMap("sub", {"x", "y"}).status()),
              HasSubstr("test.yaml:1:6: sub: expected a mapping with keys: x, y; got '3'"));
}

TEST(YamlReaderTest, ErrorAtPointsAtValueOrMapping) {
  auto map = Open("a: 1\nb:   2\n", {"a", "b", "c"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(Message(map->ErrorAt("b", "too big")), "test.yaml:2:6: b: too big");
  EXPECT_EQ(Message(map->ErrorAt("c", "needed")), "test.yaml:1:1: c: needed");
}

TEST(YamlReaderTest, BytesAcceptSizeStrings) {
  auto map = Open("a: 64MiB\nb: 4KiB\nc: 1GB\nd: 4096\ne: 16 MiB\nf: lots\ng: 2GiB\nh: 64mb\n",
                  {"a", "b", "c", "d", "e", "f", "g", "h"});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(*map->RequiredBytes("a"), 64 << 20);
  EXPECT_EQ(*map->RequiredBytes("b"), 4096);
  EXPECT_EQ(*map->RequiredBytes("c"), 1'000'000'000);
  EXPECT_EQ(*map->RequiredBytes("d"), 4096);
  EXPECT_EQ(*map->RequiredBytes("e"), 16 << 20);
  EXPECT_THAT(Message(map->RequiredBytes("f").status()),
              HasSubstr("test.yaml:6:4: f: expected a byte size such as 4096, 64KiB"));
  EXPECT_THAT(Message(map->RequiredBytes("g", {.max = int64_t{1} << 30}).status()),
              HasSubstr("g: must be ≤ 1GiB, got 2GiB"));
  // Lower-case units are ambiguous (millibits?) and rejected rather than guessed.
  EXPECT_FALSE(map->RequiredBytes("h").ok());
}

TEST(ByteSizeTest, ParseAndFormat) {
  EXPECT_EQ(*ParseByteSize("0"), 0);
  EXPECT_EQ(*ParseByteSize("12B"), 12);
  EXPECT_EQ(*ParseByteSize("1KB"), 1000);
  EXPECT_EQ(*ParseByteSize("3MB"), 3'000'000);
  EXPECT_EQ(*ParseByteSize("2TiB"), int64_t{2} << 40);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("-4").ok());
  EXPECT_FALSE(ParseByteSize("+4").ok());
  EXPECT_FALSE(ParseByteSize("1.5GiB").ok());
  EXPECT_FALSE(ParseByteSize("MiB").ok());
  EXPECT_FALSE(ParseByteSize("4 KiB ").ok());
  EXPECT_THAT(Message(ParseByteSize("99999999TiB").status()), HasSubstr("too large"));

  EXPECT_EQ(FormatByteSize(0), "0B");
  EXPECT_EQ(FormatByteSize(1000), "1000B");
  EXPECT_EQ(FormatByteSize(4096), "4KiB");
  EXPECT_EQ(FormatByteSize(64 << 20), "64MiB");
  EXPECT_EQ(FormatByteSize(int64_t{3} << 30), "3GiB");
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{1} << 20,
                          (int64_t{1} << 40) * 5, int64_t{65537} * 4}) {
    EXPECT_EQ(*ParseByteSize(FormatByteSize(n)), n) << n;
  }
}

TEST(ClosestMatchTest, SuggestsOnlyLikelyTypos) {
  const std::string_view keys[] = {"min_bytes", "max_bytes", "iterations", "ops"};
  EXPECT_EQ(ClosestMatch("max_byte", keys), "max_bytes");
  EXPECT_EQ(ClosestMatch("iteration", keys), "iterations");
  EXPECT_EQ(ClosestMatch("opz", keys), "ops");
  EXPECT_EQ(ClosestMatch("bandwidth", keys), std::nullopt);
  EXPECT_EQ(ClosestMatch("x", keys), std::nullopt);
}

TEST(ReadTextFileTest, MissingFileIsNotFoundNamingIt) {
  auto text = ReadTextFile("/nonexistent/dir/job.yaml");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(text.status()), HasSubstr("/nonexistent/dir/job.yaml"));

  auto directory = ReadTextFile("/tmp");
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::placement
