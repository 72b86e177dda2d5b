#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"

namespace shardline::checkpoint {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "/checkpoint_test_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_PATH;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A file from a header text and data bytes, with the header length given or computed: how the
// malformed files below are made.
std::string RawFile(const std::string& header, const std::string& data,
                    std::optional<uint64_t> declared_length = std::nullopt) {
  const uint64_t length = declared_length.value_or(header.size());
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(length >> (8 * i));
  return bytes + header + data;
}

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& values) {
  return std::as_bytes(std::span<const T>(values));
}

// The error of opening `bytes` as a file named bad.safetensors.
absl::Status OpenError(const std::string& bytes) {
  const std::string path = TempDir() + "/bad.safetensors";
  WriteAll(path, bytes);
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  EXPECT_FALSE(reader.ok()) << "opened a malformed file";
  if (reader.ok()) return absl::OkStatus();
  EXPECT_THAT(Message(reader.status()), HasSubstr(path)) << "the error must name the file";
  return reader.status();
}

TEST(SafetensorsTest, RoundTripIsBitExact) {
  const std::string path = TempDir() + "/model.safetensors";
  std::mt19937 rng(3);
  // Random bit patterns, NaN payloads and infinities included: nothing may be normalised.
  std::vector<uint32_t> f32_bits(1000);
  for (uint32_t& bits : f32_bits) bits = rng();
  std::vector<uint16_t> bf16_bits(333);
  for (uint16_t& bits : bf16_bits) bits = static_cast<uint16_t>(rng());
  std::vector<int64_t> i64 = {-1, 0, 1, INT64_MAX, INT64_MIN};
  std::vector<uint8_t> u8 = {1, 2, 3};
  std::vector<float> scalar = {2.5f};

  SafetensorsWriter writer(path);
  writer.SetMetadata("step", "17");
  ASSERT_TRUE(writer.Add({"w", SafetensorsDType::kF32, {10, 100}, Bytes(f32_bits)}).ok());
  ASSERT_TRUE(writer.Add({"b", SafetensorsDType::kBF16, {333}, Bytes(bf16_bits)}).ok());
  ASSERT_TRUE(writer.Add({"ids", SafetensorsDType::kI64, {5}, Bytes(i64)}).ok());
  ASSERT_TRUE(writer.Add({"bytes", SafetensorsDType::kU8, {1, 3}, Bytes(u8)}).ok());
  ASSERT_TRUE(writer.Add({"scalar", SafetensorsDType::kF32, {}, Bytes(scalar)}).ok());
  ASSERT_TRUE(writer.Add({"empty", SafetensorsDType::kF16, {0, 4}, {}}).ok());
  ASSERT_TRUE(writer.Finish().ok());

  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->metadata().at("step"), "17");
  EXPECT_EQ(reader->tensors().size(), 6u);
  const auto expect_same = [&](const std::string& name, SafetensorsDType dtype,
                               std::vector<int64_t> shape, std::span<const std::byte> bytes) {
    absl::StatusOr<const TensorInfo*> info = reader->Get(name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ((*info)->dtype, dtype) << name;
    EXPECT_EQ((*info)->shape, shape) << name;
    const std::span<const std::byte> data = reader->Data(**info);
    ASSERT_EQ(data.size(), bytes.size()) << name;
    // Not memcmp: an empty span's data() may be null, which memcmp must not be given.
    EXPECT_TRUE(std::ranges::equal(data, bytes)) << name;
  };
  expect_same("w", SafetensorsDType::kF32, {10, 100}, Bytes(f32_bits));
  expect_same("b", SafetensorsDType::kBF16, {333}, Bytes(bf16_bits));
  expect_same("ids", SafetensorsDType::kI64, {5}, Bytes(i64));
  expect_same("bytes", SafetensorsDType::kU8, {1, 3}, Bytes(u8));
  expect_same("scalar", SafetensorsDType::kF32, {}, Bytes(scalar));
  expect_same("empty", SafetensorsDType::kF16, {0, 4}, {});

  // Every tensor is aligned to its element size (the file starts page-aligned when mapped).
  const std::string file = ReadAll(path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, file.data(), 8);
  EXPECT_EQ((8 + header_length) % 8, 0u);
  for (const auto& [name, info] : reader->tensors()) {
    EXPECT_EQ(info.begin % DTypeSize(info.dtype), 0u) << name;
  }
}

TEST(SafetensorsTest, WriteReplacesAtomicallyAndLeavesNoTemporaries) {
  const std::string dir = TempDir();
  const std::string path = dir + "/a.safetensors";
  const std::vector<float> one = {1}, two = {2, 2};
  for (const std::vector<float>* values : {&one, &two}) {
    SafetensorsWriter writer(path);
    ASSERT_TRUE(writer
                    .Add({"x",
                          SafetensorsDType::kF32,
                          {static_cast<int64_t>(values->size())},
                          Bytes(*values)})
                    .ok());
    ASSERT_TRUE(writer.Finish().ok());
  }
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->tensors().at("x").shape, std::vector<int64_t>{2});
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "a.safetensors");
  }
  EXPECT_EQ(files, 1);

  SafetensorsWriter bad(dir + "/no-such-dir/b.safetensors");
  const absl::Status status = bad.Finish().status();
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(Message(status), HasSubstr("no-such-dir/b.safetensors"));
}

TEST(SafetensorsTest, WriterRejectsBadTensorsNamingThem) {
  SafetensorsWriter writer("/tmp/x.safetensors");
  const std::vector<float> values(6);
  ASSERT_TRUE(writer.Add({"a", SafetensorsDType::kF32, {2, 3}, Bytes(values)}).ok());
  const absl::Status twice = writer.Add({"a", SafetensorsDType::kF32, {6}, Bytes(values)});
  EXPECT_THAT(Message(twice),
              AllOf(HasSubstr("/tmp/x.safetensors"), HasSubstr("'a'"), HasSubstr("twice")));
  const absl::Status size = writer.Add({"b", SafetensorsDType::kF32, {2, 4}, Bytes(values)});
  EXPECT_THAT(Message(size), AllOf(HasSubstr("'b'"), HasSubstr("[2, 4]"), HasSubstr("got 24")));
  EXPECT_FALSE(writer.Add({"__metadata__", SafetensorsDType::kF32, {6}, Bytes(values)}).ok());
  EXPECT_FALSE(writer.Add({"neg", SafetensorsDType::kF32, {-6}, Bytes(values)}).ok());
}

TEST(SafetensorsTest, ReadsAFileWrittenByPyTorch) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  const std::string dir = TempDir();
  const std::string script = SourceDir() + "/tests/unit/checkpoint_reference.py";
  const std::string command =
      "/usr/bin/python3 " + script + " write " + dir + "/ref.safetensors " + dir + "/ref.json";
  const int rc = std::system(command.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77)
    GTEST_SKIP() << "PyTorch is not installed for /usr/bin/python3";
  ASSERT_EQ(rc, 0) << command;

  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(dir + "/ref.safetensors");
  ASSERT_TRUE(reader.ok()) << reader.status();
  const nlohmann::json expected = nlohmann::json::parse(ReadAll(dir + "/ref.json"));
  EXPECT_EQ(reader->metadata().at("format"), "pt");
  ASSERT_EQ(reader->tensors().size(), expected["tensors"].size());
  for (const auto& [name, want] : expected["tensors"].items()) {
    SCOPED_TRACE(name);
    absl::StatusOr<const TensorInfo*> info = reader->Get(name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(DTypeName((*info)->dtype), want["dtype"].get<std::string>());
    EXPECT_EQ((*info)->shape, want["shape"].get<std::vector<int64_t>>());
    if ((*info)->dtype == SafetensorsDType::kI64) {
      std::vector<int64_t> values(want["values"].size());
      std::memcpy(values.data(), reader->Data(**info).data(), values.size() * 8);
      EXPECT_EQ(values, want["values"].get<std::vector<int64_t>>());
      EXPECT_FALSE(reader->ReadFloat(name).ok()) << "integers are not weights";
      continue;
    }
    absl::StatusOr<HostTensor> tensor = reader->ReadFloat(name);
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    const std::vector<double> values = want["values"].get<std::vector<double>>();
    ASSERT_EQ(tensor->values.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      // Exact: every F16/BF16/F32 value is a float; F64 values are rounded the same way torch
      // rounds them to float32.
      EXPECT_EQ(tensor->values[i], static_cast<float>(values[i])) << "element " << i;
      EXPECT_EQ(std::signbit(tensor->values[i]), std::signbit(values[i])) << "element " << i;
    }
  }
}

TEST(SafetensorsTest, PyTorchReadsOurFileUnderTheStrictSpecification) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  const std::string dir = TempDir();
  const std::vector<float> f32 = {1.5f, -2.0f,
                                  3.25f};  // 12 bytes: the next tensor is not 8-aligned
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc000};  // 1.0, -2.0
  const std::vector<int64_t> i64 = {-5, 6};
  SafetensorsWriter writer(dir + "/ours.safetensors");
  writer.SetMetadata("format", "shardline");
  ASSERT_TRUE(writer.Add({"a", SafetensorsDType::kF32, {3}, Bytes(f32)}).ok());
  ASSERT_TRUE(writer.Add({"b", SafetensorsDType::kBF16, {1, 2}, Bytes(bf16)}).ok());
  ASSERT_TRUE(writer.Add({"c", SafetensorsDType::kI64, {2}, Bytes(i64)}).ok());
  ASSERT_TRUE(writer.Finish().ok());
  const std::string command = "/usr/bin/python3 " + SourceDir() +
                              "/tests/unit/checkpoint_reference.py read " + dir +
                              "/ours.safetensors " + dir + "/ours.json";
  const int rc = std::system(command.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77)
    GTEST_SKIP() << "PyTorch is not installed for /usr/bin/python3";
  ASSERT_EQ(rc, 0) << command;
  const nlohmann::json got = nlohmann::json::parse(ReadAll(dir + "/ours.json"));
  EXPECT_EQ(got["metadata"]["format"], "shardline");
  EXPECT_EQ(got["tensors"]["a"]["values"].get<std::vector<double>>(),
            (std::vector<double>{1.5, -2.0, 3.25}));
  EXPECT_EQ(got["tensors"]["b"]["shape"].get<std::vector<int64_t>>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(got["tensors"]["b"]["values"].get<std::vector<double>>(), (std::vector<double>{1, -2}));
  EXPECT_EQ(got["tensors"]["c"]["values"].get<std::vector<int64_t>>(), i64);
}

TEST(SafetensorsTest, HalfPrecisionConversionIsExact) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0x4049), 3.140625f);
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  const std::string path = TempDir() + "/absent.safetensors";
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(reader.status()), HasSubstr(path));
}

TEST(SafetensorsTest, ShorterThanTheLengthFieldIsTruncated) {
  EXPECT_THAT(Message(OpenError("abcd")), HasSubstr("truncated"));
}

TEST(SafetensorsTest, HeaderLengthPastTheEndIsAnError) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_THAT(Message(OpenError(RawFile(header, "abcd", 1'000'000))),
              AllOf(HasSubstr("header length is 1000000"), HasSubstr("truncated")));
}

TEST(SafetensorsTest, TruncatedDataNamesTheTensor) {
  // A valid file cut short: the last tensor's bytes are gone.
  const std::string dir = TempDir();
  const std::string path = dir + "/cut.safetensors";
  const std::vector<float> big(100), small(3);
  SafetensorsWriter writer(path);
  ASSERT_TRUE(writer.Add({"big", SafetensorsDType::kF32, {100}, Bytes(big)}).ok());
  ASSERT_TRUE(writer.Add({"small", SafetensorsDType::kF16, {3}, Bytes(small).first(6)}).ok());
  ASSERT_TRUE(writer.Finish().ok());
  const std::string whole = ReadAll(path);
  const absl::Status status = OpenError(whole.substr(0, whole.size() - 5));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status),
              AllOf(HasSubstr("tensor 'small'"), HasSubstr("outside the data section"),
                    HasSubstr("truncated")));
}

TEST(SafetensorsTest, BadJsonIsAnError) {
  EXPECT_THAT(Message(OpenError(RawFile(R"({"a": {"dtype": )", ""))), HasSubstr("not valid JSON"));
  EXPECT_THAT(Message(OpenError(RawFile("[1, 2]", ""))), HasSubstr("expected an object"));
}

TEST(SafetensorsTest, UnknownDtypeNamesTheTensor) {
  const std::string header = R"({"layer.w":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_THAT(Message(OpenError(RawFile(header, "abcd"))),
              AllOf(HasSubstr("tensor 'layer.w'"), HasSubstr("unknown dtype \"F12\"")));
}

TEST(SafetensorsTest, ShapeSizeMismatchNamesTheTensor) {
  const std::string header = R"({"layer.w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})";
  EXPECT_THAT(Message(OpenError(RawFile(header, std::string(20, 'x')))),
              AllOf(HasSubstr("tensor 'layer.w'"), HasSubstr("[2, 3] of F32 needs 24 bytes"),
                    HasSubstr("hold 20")));
}

TEST(SafetensorsTest, OverlappingRangesNameBothTensors) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_THAT(Message(OpenError(RawFile(header, std::string(12, 'x')))),
              AllOf(HasSubstr("tensor 'b'"), HasSubstr("overlaps tensor 'a'")));
}

TEST(SafetensorsTest, MalformedEntriesNameTheTensor) {
  const std::string data(8, 'x');
  EXPECT_THAT(Message(OpenError(
                  RawFile(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data))),
              AllOf(HasSubstr("tensor 't'"), HasSubstr("invalid dimension")));
  EXPECT_THAT(Message(OpenError(RawFile(R"({"t":{"dtype":"F32","shape":[2]}})", data))),
              AllOf(HasSubstr("tensor 't'"), HasSubstr("data_offsets")));
  EXPECT_THAT(Message(OpenError(
                  RawFile(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data))),
              HasSubstr("tensor 't'"));
  EXPECT_THAT(Message(OpenError(RawFile(R"({"__metadata__":{"k":1}})", ""))),
              AllOf(HasSubstr("__metadata__ key 'k'"), HasSubstr("expected a string")));
}

TEST(SafetensorsTest, MissingTensorAndWrongDtypeNameFileAndTensor) {
  const std::string path = TempDir() + "/ids.safetensors";
  const std::vector<int64_t> ids = {1, 2};
  SafetensorsWriter writer(path);
  ASSERT_TRUE(writer.Add({"ids", SafetensorsDType::kI64, {2}, Bytes(ids)}).ok());
  ASSERT_TRUE(writer.Finish().ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const absl::Status missing = reader->Get("wte").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing), AllOf(HasSubstr(path), HasSubstr("'wte' is missing")));
  const absl::Status wrong = reader->ReadFloat("ids").status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(wrong), AllOf(HasSubstr(path), HasSubstr("'ids' has dtype I64")));
}

TEST(SafetensorsTest, ReaderIsMovable) {
  const std::string path = TempDir() + "/m.safetensors";
  const std::vector<float> values = {4, 5};
  SafetensorsWriter writer(path);
  ASSERT_TRUE(writer.Add({"v", SafetensorsDType::kF32, {2}, Bytes(values)}).ok());
  ASSERT_TRUE(writer.Finish().ok());
  absl::StatusOr<SafetensorsReader> opened = SafetensorsReader::Open(path);
  ASSERT_TRUE(opened.ok());
  SafetensorsReader moved = *std::move(opened);
  SafetensorsReader assigned = std::move(moved);
  absl::StatusOr<HostTensor> tensor = assigned.ReadFloat("v");
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->values, values);
}

}  // namespace
}  // namespace shardline::checkpoint
