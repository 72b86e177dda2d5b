// All-reduce bus bandwidth of OpenMPI's MPI_Allreduce, the peer Gloo and Shardline are measured
// against. Run under mpirun (ranks are MPI processes); --ranks is ignored, the world size is
// mpirun's -np. Pass --label to name an algorithm forced through --mca options.
//
// --impl mpi,shm (with --store DIR, an empty directory every rank sees) also holds Shardline's
// shared-memory communicator in the same processes, and the two alternate operation by operation
// (RunAllreduceBench): the ratio is then paired. That is the figure to trust on a host whose
// speed changes from one run to the next (a VM whose vCPUs the hypervisor moves between core
// complexes ran 64 KiB-1 MiB 2-5x slower in some runs than in others, alike for both).
// shm is the default (tuned) communicator; shm-oneshot, shm-copy, shm-single and the streamed
// variants of the first two (shm-oneshot-streamed, shm-copy-streamed) force one
// algorithm each (ShmOptions::all_reduce), to see what the tuner chooses between. shm-shared is
// the tuned communicator over a buffer from SharedHostAllocator, which its peers map (as the
// trainer's data-parallel gradients are; MPI and the other shm rows use plain heap memory).
#include <mpi.h>

#include <cstdio>
#include <memory>

#include "bench/allreduce_bench_common.h"
#include "worker/comm/file_store.h"
#include "worker/comm/shared_host_memory.h"
#include "worker/comm/shm_communicator.h"

namespace {
using namespace shardline;

struct ShmImpl {
  std::unique_ptr<comm::PrefixStore> store;
  std::unique_ptr<comm::Communicator> communicator;
  void* shared = nullptr;  // shm-shared's buffer, from `allocator`
  size_t shared_bytes = 0;
  comm::SharedHostAllocator* allocator = nullptr;
  ~ShmImpl() {
    communicator.reset();
    if (allocator != nullptr) allocator->Deallocate(shared, shared_bytes);
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  bench::AllreduceBenchArgs args;
  args.impl = "mpi";
  // ParseArgs insists on --ranks >= 2; the world size is what counts here.
  if (!bench::ParseArgs(argc, argv, args,
                        "mpirun -np N allreduce_mpi [--min-bytes B] [--max-bytes B] "
                        "[--label NAME] [--impl mpi,shm,shm-shared,shm-copy,shm-single,shm-oneshot,shm-copy-streamed,shm-oneshot-streamed --store DIR]") ||
      size < 2) {
    if (size < 2) fprintf(stderr, "allreduce_mpi: run it with mpirun -np N, N >= 2\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  args.ranks = size;
  std::vector<bench::AllreduceImpl> impls;
  std::unique_ptr<comm::FileStore> files;
  comm::SharedHostAllocator shared_allocator;  // outlives `shms`
  std::vector<std::unique_ptr<ShmImpl>> shms;
  const auto report = [rank](const absl::Status& status) {
    if (!status.ok()) fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
    return status.ok();
  };
  std::string list = args.impl + ",";
  for (size_t at = 0, next; (next = list.find(',', at)) != std::string::npos; at = next + 1) {
    const std::string name = list.substr(at, next - at);
    if (name == "mpi") {
      impls.push_back({args.label.empty() ? "mpi" : args.label,
                       [](float* data, size_t count) {
                         return MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count),
                                              MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
                       },
                       [] { return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS; }});
      continue;
    }
    comm::ShmOptions options;
    options.timeout = std::chrono::seconds(300);
    if (name == "shm-copy") {
      options.all_reduce = comm::ShmAlgorithm::kChunked;
    } else if (name == "shm-single") {
      options.all_reduce = comm::ShmAlgorithm::kSingleCopy;
    } else if (name == "shm-oneshot") {
      options.all_reduce = comm::ShmAlgorithm::kOneShot;
    } else if (name == "shm-copy-streamed") {
      options.all_reduce = comm::ShmAlgorithm::kChunkedStreamed;
    } else if (name == "shm-oneshot-streamed") {
      options.all_reduce = comm::ShmAlgorithm::kOneShotStreamed;
    } else if (name != "shm" && name != "shm-shared") {
      fprintf(stderr,
              "allreduce_mpi: --impl lists mpi, shm, shm-shared, shm-copy, shm-single, "
              "shm-oneshot, shm-copy-streamed, shm-oneshot-streamed, not '%s'\n",
              name.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (args.store.empty()) {
      fprintf(stderr, "allreduce_mpi: %s needs --store DIR\n", name.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (!files) {
      auto opened = comm::FileStore::Open(args.store);
      if (!report(opened.status())) MPI_Abort(MPI_COMM_WORLD, 3);
      files = *std::move(opened);
    }
    auto shm = std::make_unique<ShmImpl>();
    shm->store = std::make_unique<comm::PrefixStore>(name, *files);
    auto created = comm::CreateShmCommunicator(*shm->store, rank, size, options);
    if (!report(created.status())) MPI_Abort(MPI_COMM_WORLD, 3);
    shm->communicator = *std::move(created);
    if (name == "shm-shared") {
      auto shared = shared_allocator.Allocate(args.max_bytes);
      if (!report(shared.status())) MPI_Abort(MPI_COMM_WORLD, 3);
      shm->shared = *shared;
      shm->shared_bytes = args.max_bytes;
      shm->allocator = &shared_allocator;
    }
    comm::Communicator* c = shm->communicator.get();
    impls.push_back({name,
                     [c, report](float* data, size_t count) {
                       return report(c->AllReduce(data, count, DType::kFloat32,
                                                  comm::ReduceOp::kSum));
                     },
                     [c, report] { return report(c->Barrier()); }});
    impls.back().buffer = static_cast<float*>(shm->shared);
    shms.push_back(std::move(shm));
  }
  const int code = bench::RunAllreduceBench(rank, size, args, impls);
  if (code != 0) MPI_Abort(MPI_COMM_WORLD, code);
  shms.clear();
  MPI_Finalize();
  return 0;
}
