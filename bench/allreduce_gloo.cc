// All-reduce bus bandwidth of Shardline's communicators (shared memory: "shm"; Gloo: "shardline")
// against raw Gloo and a memcpy of the same bytes, ranks as forked processes on one host (Gloo over
// loopback). "Raw Gloo" is the same TCP transport, rendezvous and ring algorithm
// (gloo::allreduce, AllreduceOptions, RING) that GlooCommunicator uses, called directly with none
// of our layers: the difference is our overhead. Every rank holds every implementation named by
// --impl (a comma-separated list; default shm,shardline,gloo,memcpy; "both" is shardline,gloo),
// and they alternate round by round (see RunAllreduceBench).
// bench/allreduce_compare.py runs this and allreduce_mpi and prints one table.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "bench/allreduce_bench_common.h"
#include "worker/comm/communicator.h"
#include "worker/comm/file_store.h"
#include "worker/comm/shm_communicator.h"

namespace {
using namespace shardline;
using ReduceFn = void (*)(void*, const void*, const void*, size_t);
constexpr auto kTimeout = std::chrono::seconds(300);

using Report = std::function<bool(const absl::Status&)>;

// A Shardline communicator as a benchmark implementation: f32 sum all-reduces and its barrier.
bench::AllreduceImpl CommunicatorImpl(const std::string& name, comm::Communicator* c,
                                      const Report& report) {
  return {name,
          [c, report](float* data, size_t count) {
            return report(c->AllReduce(data, count, DType::kFloat32, comm::ReduceOp::kSum));
          },
          [c, report] { return report(c->Barrier()); }};
}

int RankMain(int rank, const bench::AllreduceBenchArgs& args, const std::string& dir) {
  const std::string list = "," + (args.impl == "both" ? std::string("shardline,gloo") : args.impl) + ",";
  const auto wants = [&](const char* name) {
    return list.find("," + std::string(name) + ",") != std::string::npos;
  };
  const bool want_shardline = wants("shardline");
  const bool want_gloo = wants("gloo");
  std::vector<bench::AllreduceImpl> impls;

  std::unique_ptr<comm::FileStore> files;
  std::unique_ptr<comm::PrefixStore> store;
  std::unique_ptr<comm::Communicator> communicator;
  const Report report = [rank](const absl::Status& status) {
    if (!status.ok()) fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
    return status.ok();
  };
  if (want_shardline || wants("shm")) {
    auto opened = comm::FileStore::Open(dir);
    if (!report(opened.status())) return 2;
    files = *std::move(opened);
  }
  std::unique_ptr<comm::PrefixStore> shm_store;
  std::unique_ptr<comm::Communicator> shm;
  if (wants("shm")) {
    shm_store = std::make_unique<comm::PrefixStore>("shm", *files);
    comm::ShmOptions options;
    options.timeout = kTimeout;
    auto created = comm::CreateShmCommunicator(*shm_store, rank, args.ranks, options);
    if (!report(created.status())) return 3;
    shm = *std::move(created);
    impls.push_back(CommunicatorImpl("shm", shm.get(), report));
  }
  if (want_shardline) {
    store = std::make_unique<comm::PrefixStore>("shardline", *files);
    comm::GlooOptions options;
    options.hostname = "127.0.0.1";
    options.timeout = kTimeout;
    auto created = comm::CreateGlooCommunicator(*store, rank, args.ranks, options);
    if (!report(created.status())) return 3;
    communicator = *std::move(created);
    impls.push_back(CommunicatorImpl("shardline", communicator.get(), report));
  }

  std::unique_ptr<gloo::rendezvous::FileStore> gloo_files;
  std::unique_ptr<gloo::rendezvous::PrefixStore> gloo_store;
  std::shared_ptr<gloo::rendezvous::Context> context;
  uint32_t tag = 0;
  try {
    if (want_gloo) {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      auto device = gloo::transport::tcp::CreateDevice(attr);
      gloo_files = std::make_unique<gloo::rendezvous::FileStore>(dir);
      gloo_store = std::make_unique<gloo::rendezvous::PrefixStore>("raw", *gloo_files);
      context = std::make_shared<gloo::rendezvous::Context>(rank, args.ranks);
      context->setTimeout(kTimeout);
      context->connectFullMesh(*gloo_store, device);
      impls.push_back({"gloo",
                       [&](float* data, size_t count) {
                         gloo::AllreduceOptions opts(context);
                         opts.setOutput(data, count);
                         opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
                         opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
                         opts.setTag(tag++);
                         gloo::allreduce(opts);
                         return true;
                       },
                       [&] {
                         gloo::BarrierOptions opts(context);
                         opts.setTag(tag++);
                         gloo::barrier(opts);
                         return true;
                       }});
    }
    // The floor every all-reduce pays at least once: reading and writing its bytes.
    std::vector<float> copy;
    if (wants("memcpy")) {
      copy.resize(args.max_bytes / sizeof(float));
      comm::Communicator* barrier = shm ? shm.get() : communicator.get();
      impls.push_back({"memcpy",
                       [&copy](float* data, size_t count) {
                         std::memcpy(copy.data(), data, count * sizeof(float));
                         std::memcpy(data, copy.data(), count * sizeof(float));
                         return true;
                       },
                       [barrier, report] { return barrier ? report(barrier->Barrier()) : true; },
                       /*reduces=*/false});
    }
    if (impls.empty() || impls.front().name == "memcpy") {
      fprintf(stderr, "--impl lists shm, shardline, gloo, memcpy (not first), not '%s'\n",
              args.impl.c_str());
      return 2;
    }
    return bench::RunAllreduceBench(rank, args.ranks, args, impls);
  } catch (const std::exception& e) {
    fprintf(stderr, "raw gloo, rank %d: %s\n", rank, e.what());
    return 4;
  }
}

}  // namespace

int main(int argc, char** argv) {
  shardline::bench::AllreduceBenchArgs args;
  if (!shardline::bench::ParseArgs(argc, argv, args,
                                   "allreduce_gloo [--ranks N] [--min-bytes B] [--max-bytes B] "
                                   "[--impl shm,shardline,gloo,memcpy]")) {
    return 2;
  }
  const std::string dir = shardline::bench::MakeTempDir("allreduce_gloo");
  const int code =
      shardline::bench::ForkRanks(args.ranks, [&](int rank) { return RankMain(rank, args, dir); });
  shardline::bench::RemoveDir(dir);
  return code;
}
