// Writes the seed inputs that the project's own writers make, so that the committed seeds are
// what real peers and real checkpoints hold: Envelope frames (protocol/envelope.h), safetensors
// files (SafetensorsWriter) and manifests (ManifestToJson), under DIR/envelope, DIR/safetensors and
// DIR/manifest. Run it again after a format change: seed_corpus_writer fuzz/corpus.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_writer.h"
#include "protocol/envelope.h"

namespace {

namespace fs = std::filesystem;
using shardline::checkpoint::SafetensorsDType;
using shardline::protocol::Outgoing;

void WriteFile(const fs::path& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

void WriteFrame(const fs::path& dir, const std::string& name, Outgoing& outgoing) {
  const kj::Array<capnp::word> words = outgoing.Serialize();
  WriteFile(dir / name, words.begin(), words.size() * sizeof(capnp::word));
}

void WriteEnvelopes(const fs::path& dir) {
  fs::create_directories(dir);
  {
    Outgoing out("local", "agent/node-0", 7);
    auto node = out.payload().initRegisterNode();
    node.setNodeId("node-0");
    node.setInstanceId("3f2a");
    node.setHostname("host-a");
    node.setAddress("127.0.0.1");
    auto devices = node.initDevices(2);
    devices[0].setKind(shardline::wire::DeviceKind::CPU);
    devices[0].setMemoryBytes(1ull << 30);
    devices[0].setName("cpu");
    devices[1].setKind(shardline::wire::DeviceKind::CUDA);
    devices[1].setIndex(1);
    devices[1].setName("NVIDIA H200");
    node.setPid(4242);
    WriteFrame(dir, "register_node.bin", out);
  }
  {
    Outgoing out("local", "agent/node-0", 0);
    auto heartbeat = out.payload().initHeartbeat();
    heartbeat.setNodeId("node-0");
    heartbeat.setRunningActors(2);
    auto stopped = heartbeat.initStoppedActors(1);
    stopped[0].setJobId("job-1");
    stopped[0].setGeneration(3);
    stopped[0].setRank(1);
    WriteFrame(dir, "heartbeat.bin", out);
  }
  {
    Outgoing out("local", "cli", 9);
    auto submit = out.payload().initSubmitJob();
    submit.setSpecYaml("kind: comm-check\nactors: 2\n");
    submit.setSourceName("job.yaml");
    WriteFrame(dir, "submit_job.bin", out);
  }
  {
    Outgoing out("local", "actor/job-1/3/0", 11);
    auto kv = out.payload().initKvRequest();
    kv.setOp(shardline::wire::KvOp::SET);
    kv.setKey("gen/3/nccl/world");
    const char value[] = "\x00\x01\x02\x03";
    kv.setValue(shardline::protocol::AsData(std::string_view(value, 4)));
    WriteFrame(dir, "kv_request.bin", out);
  }
  {
    Outgoing out("local", "actor/job-1/3/1", 0);
    auto report = out.payload().initStepReport();
    report.setJobId("job-1");
    report.setGeneration(3);
    report.setRank(1);
    report.setStep(100);
    report.setLoss(2.5);
    report.setLogged(true);
    WriteFrame(dir, "step_report.bin", out);
  }
  {
    Outgoing out("local", "coordinator", 7);
    shardline::protocol::SetError(out.payload(), absl::NotFoundError("node node-0 is unknown"));
    WriteFrame(dir, "error.bin", out);
  }
  {
    Outgoing out("", "", 0);
    out.payload().setAck();
    WriteFrame(dir, "ack_empty_header.bin", out);
  }
}

struct Tensor {
  std::string name;
  SafetensorsDType dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
};

void WriteSafetensors(const fs::path& dir, const std::string& name,
                      const std::vector<Tensor>& tensors, bool metadata) {
  shardline::checkpoint::SafetensorsWriter writer((dir / name).string());
  if (metadata) writer.SetMetadata("format", "pt");
  for (const Tensor& t : tensors) {
    const absl::Status added = writer.Add(
        {t.name, t.dtype, t.shape, std::as_bytes(std::span<const unsigned char>(t.bytes))});
    if (!added.ok()) {
      std::fprintf(stderr, "%s\n", added.ToString().c_str());
      std::exit(1);
    }
  }
  const auto written = writer.Finish();
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", written.status().ToString().c_str());
    std::exit(1);
  }
}

void WriteSafetensorsSeeds(const fs::path& dir) {
  fs::create_directories(dir);
  const float f32[2] = {1.5f, -2.0f};
  std::vector<unsigned char> f32_bytes(sizeof(f32));
  std::memcpy(f32_bytes.data(), f32, sizeof(f32));
  WriteSafetensors(dir, "one_f32.safetensors", {{"w", SafetensorsDType::kF32, {2}, f32_bytes}},
                   false);
  WriteSafetensors(dir, "mixed.safetensors",
                   {{"h.0.attn.w", SafetensorsDType::kBF16, {2, 2}, {0, 0x3f, 0, 0xc0, 0x80, 0x3f, 0, 0}},
                    {"h.0.ln.b", SafetensorsDType::kF16, {3}, {0, 0x3c, 0, 0xbc, 0xff, 0x7b}},
                    {"step", SafetensorsDType::kI64, {}, {5, 0, 0, 0, 0, 0, 0, 0}},
                    {"empty", SafetensorsDType::kF32, {0, 4}, {}},
                    {"mask", SafetensorsDType::kBool, {3}, {1, 0, 1}},
                    {"scale", SafetensorsDType::kF64, {1}, {0, 0, 0, 0, 0, 0, 0xf0, 0x3f}}},
                   true);
  WriteSafetensors(dir, "no_tensors.safetensors", {}, true);
}

shardline::checkpoint::Manifest TwoRankManifest() {
  using namespace shardline::checkpoint;
  Manifest m;
  m.step = 20;
  m.world_size = 2;
  m.metadata = {{"layers", "2"}, {"d_model", "8"}, {"heads", "2"}};
  m.train.seed = 1234;
  m.train.batch = 4;
  m.train.seq_len = 16;
  m.train.data.source = "file";
  m.train.data.path = "/data/tiny.txt";
  m.train.data.tokens = 1000;
  m.train.data.xxh3 = 0x0123456789abcdefull;
  m.train.steps = 100;
  m.train.optimizer = {3e-4, 0.9, 0.95, 1e-8, 0.1, 1.0, 10};
  m.plan.tp = 2;
  m.plan.stage_layers = {2};
  m.files["rank-0.safetensors"] = {0, 4096, 0x1111222233334444ull};
  m.files["rank-1.safetensors"] = {1, 4096, 0x5555666677778888ull};
  ManifestTensor split;
  split.dtype = SafetensorsDType::kF32;
  split.global_shape = {8, 4};
  split.shards.push_back({0, "rank-0.safetensors", "wte", {0, 0}, {4, 4}, 0xaaaaull});
  split.shards.push_back({1, "rank-1.safetensors", "wte", {4, 0}, {4, 4}, 0xbbbbull});
  m.tensors["wte"] = split;
  ManifestTensor replicated;
  replicated.dtype = SafetensorsDType::kBF16;
  replicated.global_shape = {4};
  replicated.shards.push_back({0, "rank-0.safetensors", "ln_f.w", {0}, {4}, 0xccccull});
  replicated.shards.push_back({1, "rank-1.safetensors", "ln_f.w", {0}, {4}, 0xccccull});
  m.tensors["ln_f.w"] = replicated;
  ManifestTensor moment = split;
  m.tensors["optim.exp_avg.wte"] = moment;
  m.tensors["optim.exp_avg_sq.wte"] = moment;
  ManifestTensor empty;
  empty.global_shape = {0, 3};
  m.tensors["empty"] = empty;
  return m;
}

void WriteManifests(const fs::path& dir) {
  using namespace shardline::checkpoint;
  fs::create_directories(dir);
  const Manifest two_ranks = TwoRankManifest();
  const std::string text = ManifestToJson(two_ranks);
  WriteFile(dir / "two_ranks.json", text.data(), text.size());
  Manifest synthetic;
  synthetic.world_size = 1;
  synthetic.train.data.source = "synthetic";
  synthetic.train.data.synthetic_seed = 7;
  synthetic.train.data.synthetic_bytes = 65536;
  const std::string minimal = ManifestToJson(synthetic);
  WriteFile(dir / "synthetic_no_tensors.json", minimal.data(), minimal.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  WriteEnvelopes(root / "envelope");
  WriteSafetensorsSeeds(root / "safetensors");
  WriteManifests(root / "manifest");
  return 0;
}
