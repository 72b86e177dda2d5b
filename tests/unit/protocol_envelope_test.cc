// Envelope encoding and bounded decoding: every payload round-trips; bad frames are refused with
// the right reason and never crash the decoder.
#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include <gtest/gtest.h>
#include <kj/string.h>

#include <random>

#include "protocol/envelope.h"

namespace shardline::protocol {
namespace {

// Fills every field of `builder` with a value derived from the field's name, recursively, so
// that a round trip compares something in every field of every message.
void Fill(capnp::DynamicStruct::Builder builder, int depth);

void FillValue(capnp::DynamicStruct::Builder parent, capnp::StructSchema::Field field, int depth) {
  const auto type = field.getType();
  const std::string name = field.getProto().getName().cStr();
  const auto seed = static_cast<uint32_t>(std::hash<std::string>{}(name) % 1000 + 1);
  switch (type.which()) {
    case capnp::schema::Type::VOID: parent.set(field, capnp::VOID); break;
    case capnp::schema::Type::BOOL: parent.set(field, true); break;
    case capnp::schema::Type::INT8:
    case capnp::schema::Type::INT16:
    case capnp::schema::Type::INT32:
    case capnp::schema::Type::INT64: parent.set(field, -static_cast<int64_t>(seed)); break;
    case capnp::schema::Type::UINT8:
    case capnp::schema::Type::UINT16:
    case capnp::schema::Type::UINT32:
    case capnp::schema::Type::UINT64: parent.set(field, static_cast<uint64_t>(seed % 200 + 1)); break;
    case capnp::schema::Type::FLOAT32:
    case capnp::schema::Type::FLOAT64: parent.set(field, seed + 0.25); break;
    case capnp::schema::Type::TEXT: parent.set(field, capnp::Text::Reader(name.c_str())); break;
    case capnp::schema::Type::DATA: {
      const std::string bytes = "\x01\x00\xff" + name;
      parent.set(field, AsData(bytes));
      break;
    }
    case capnp::schema::Type::ENUM: {
      auto enumerants = type.asEnum().getEnumerants();
      parent.set(field, capnp::DynamicEnum(enumerants[enumerants.size() - 1]));
      break;
    }
    case capnp::schema::Type::STRUCT:
      if (depth < 4) Fill(parent.init(field).as<capnp::DynamicStruct>(), depth + 1);
      break;
    case capnp::schema::Type::LIST: {
      auto list = parent.init(field, 2).as<capnp::DynamicList>();
      const auto element = type.asList().getElementType();
      for (unsigned i = 0; i < list.size(); ++i) {
        switch (element.which()) {
          case capnp::schema::Type::STRUCT:
            Fill(list[i].as<capnp::DynamicStruct>(), depth + 1);
            break;
          case capnp::schema::Type::TEXT:
            list.set(i, capnp::Text::Reader("item"));
            break;
          default:
            list.set(i, static_cast<uint64_t>(i + 7));
            break;
        }
      }
      break;
    }
    default: break;
  }
}

void Fill(capnp::DynamicStruct::Builder builder, int depth) {
  for (auto field : builder.getSchema().getNonUnionFields()) FillValue(builder, field, depth);
}

std::vector<uint8_t> Bytes(Outgoing& out) {
  auto words = out.Serialize();
  auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

TEST(EnvelopeTest, EveryPayloadRoundTripsWithEveryField) {
  const auto payload_schema = capnp::Schema::from<wire::Envelope::Payload>();
  const auto union_fields = payload_schema.getUnionFields();
  ASSERT_GT(union_fields.size(), 20u);
  for (auto field : union_fields) {
    SCOPED_TRACE(field.getProto().getName().cStr());
    Outgoing out("cluster-a", "tester", 42);
    capnp::DynamicStruct::Builder payload = out.payload();
    FillValue(payload, field, 0);
    const std::string sent = kj::str(out.envelope().asReader()).cStr();
    const auto bytes = Bytes(out);

    auto decoded = Decode(bytes.data(), bytes.size(), "cluster-a");
    ASSERT_TRUE(decoded.ok()) << decoded.status;
    const std::string received = kj::str(decoded.message->envelope()).cStr();
    EXPECT_EQ(sent, received);
    EXPECT_EQ(decoded.message->request_id(), 42u);
    EXPECT_EQ(capnp::DynamicStruct::Reader(decoded.message->envelope().getPayload()).which(),
              field);
    EXPECT_NE(PayloadName(decoded.message->which()), "unknown");
  }
}

TEST(EnvelopeTest, TruncatedFramesAreRefused) {
  Outgoing out("c", "tester", 9);
  out.payload().initSubmitJob().setSpecYaml("name: x\nkind: comm-check\n");
  const auto bytes = Bytes(out);
  for (size_t cut : {size_t{0}, size_t{3}, size_t{8}, bytes.size() / 2, bytes.size() - 8,
                     bytes.size() - 1}) {
    SCOPED_TRACE(cut);
    auto decoded = Decode(bytes.data(), cut, "c");
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(decoded.failure, DecodeFailure::kTruncated) << decoded.status;
  }
}

TEST(EnvelopeTest, GarbageIsRefusedNeverCrashes) {
  std::mt19937_64 rng(7);
  int refused = 0;
  for (int i = 0; i < 5000; ++i) {
    std::vector<uint64_t> words(1 + rng() % 64);
    for (auto& w : words) w = rng();
    // Half the frames get a plausible segment table, so that the pointer checks are exercised.
    if (i % 2 == 0) {
      words[0] = static_cast<uint64_t>(words.size() - 1) << 32;  // one segment of the rest
    }
    auto decoded = Decode(words.data(), words.size() * 8, "c");
    if (!decoded.ok()) {
      ++refused;
      EXPECT_NE(decoded.failure, DecodeFailure::kNone);
    }
  }
  // Random words essentially never form an envelope of our version and cluster.
  EXPECT_EQ(refused, 5000);
}

TEST(EnvelopeTest, PointerCyclesAndDeepNestingStayBounded) {
  // One segment whose root pointer points at itself: a decoder without limits loops forever.
  std::vector<uint64_t> words = {uint64_t{2} << 32, 0, 0};
  words[1] = 0xfffffffc;  // struct pointer, offset -1: to itself
  auto decoded = Decode(words.data(), words.size() * 8, "c");
  EXPECT_FALSE(decoded.ok());
}

TEST(EnvelopeTest, OversizedFrameIsRefusedBeforeDecoding) {
  std::vector<uint8_t> big(kMaxFrameBytes + 8, 0);
  auto decoded = Decode(big.data(), big.size(), "c");
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.failure, DecodeFailure::kOversized);
  EXPECT_NE(std::string(decoded.status.message()).find("exceeds"), std::string::npos);
}

TEST(EnvelopeTest, OtherProtocolVersionIsRefusedWithItsRequestId) {
  Outgoing out("c", "tester", 77);
  out.envelope().setProtocolVersion(wire::PROTOCOL_VERSION + 1);
  out.payload().setAck();
  const auto bytes = Bytes(out);
  auto decoded = Decode(bytes.data(), bytes.size(), "c");
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.failure, DecodeFailure::kVersion);
  EXPECT_EQ(decoded.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(decoded.request_id, 77u);
  EXPECT_NE(std::string(decoded.status.message()).find("protocol version 2"), std::string::npos);
}

TEST(EnvelopeTest, OtherClusterIsRefused) {
  Outgoing out("cluster-b", "tester", 5);
  out.payload().setAck();
  const auto bytes = Bytes(out);
  auto decoded = Decode(bytes.data(), bytes.size(), "cluster-a");
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.failure, DecodeFailure::kCluster);
  EXPECT_NE(std::string(decoded.status.message()).find("cluster-b"), std::string::npos);
  // An empty expectation accepts any cluster (the CLI before it knows the cluster's id).
  EXPECT_TRUE(Decode(bytes.data(), bytes.size(), "").ok());
}

TEST(EnvelopeTest, ErrorPayloadCarriesTheStatus) {
  Outgoing out("c", "coordinator", 3);
  SetError(out.payload(), absl::NotFoundError("node n1 is unknown"));
  const auto bytes = Bytes(out);
  auto decoded = Decode(bytes.data(), bytes.size(), "c");
  ASSERT_TRUE(decoded.ok());
  const auto status = ErrorToStatus(decoded.message->envelope().getPayload().getError());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "node n1 is unknown");
}

}  // namespace
}  // namespace shardline::protocol
