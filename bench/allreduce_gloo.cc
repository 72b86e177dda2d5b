// All-reduce bus bandwidth of Shardline's GlooCommunicator against raw Gloo, ranks as forked
// processes on loopback. "Raw Gloo" is the same TCP transport, rendezvous and ring algorithm
// (gloo::allreduce, AllreduceOptions, RING) that GlooCommunicator uses, called directly with none
// of our layers: the difference is our overhead. With --impl both (the default) every rank holds
// both, and they alternate round by round (see RunAllreduceBench).
// bench/allreduce_compare.py runs this and allreduce_mpi and prints one table.
#include <chrono>
#include <cstdio>
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

namespace {
using namespace shardline;
using ReduceFn = void (*)(void*, const void*, const void*, size_t);
constexpr auto kTimeout = std::chrono::seconds(300);

int RankMain(int rank, const bench::AllreduceBenchArgs& args, const std::string& dir) {
  const bool want_shardline = args.impl == "both" || args.impl == "shardline";
  const bool want_gloo = args.impl == "both" || args.impl == "gloo";
  std::vector<bench::AllreduceImpl> impls;

  std::unique_ptr<comm::FileStore> files;
  std::unique_ptr<comm::PrefixStore> store;
  std::unique_ptr<comm::Communicator> communicator;
  const auto report = [rank](const absl::Status& status) {
    if (!status.ok()) fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
    return status.ok();
  };
  if (want_shardline) {
    auto opened = comm::FileStore::Open(dir);
    if (!report(opened.status())) return 2;
    files = *std::move(opened);
    store = std::make_unique<comm::PrefixStore>("shardline", *files);
    comm::GlooOptions options;
    options.hostname = "127.0.0.1";
    options.timeout = kTimeout;
    auto created = comm::CreateGlooCommunicator(*store, rank, args.ranks, options);
    if (!report(created.status())) return 3;
    communicator = *std::move(created);
    comm::Communicator* c = communicator.get();
    impls.push_back({"shardline",
                     [c, report](float* data, size_t count) {
                       return report(
                           c->AllReduce(data, count, DType::kFloat32, comm::ReduceOp::kSum));
                     },
                     [c, report] { return report(c->Barrier()); }});
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
    if (impls.empty()) {
      fprintf(stderr, "--impl must be shardline, gloo or both, not '%s'\n", args.impl.c_str());
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
                                   "[--impl shardline|gloo|both]")) {
    return 2;
  }
  const std::string dir = shardline::bench::MakeTempDir("allreduce_gloo");
  const int code =
      shardline::bench::ForkRanks(args.ranks, [&](int rank) { return RankMain(rank, args, dir); });
  shardline::bench::RemoveDir(dir);
  return code;
}
