// All-reduce bus bandwidth of OpenMPI's MPI_Allreduce, the peer Gloo and Shardline are measured
// against. Run under mpirun (ranks are MPI processes); --ranks is ignored, the world size is
// mpirun's -np. Pass --label to name an algorithm forced through --mca options.
#include <mpi.h>

#include <cstdio>

#include "bench/allreduce_bench_common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  shardline::bench::AllreduceBenchArgs args;
  // ParseArgs insists on --ranks >= 2; the world size is what counts here.
  if (!shardline::bench::ParseArgs(argc, argv, args,
                                   "mpirun -np N allreduce_mpi [--min-bytes B] [--max-bytes B] "
                                   "[--label NAME]") ||
      size < 2) {
    if (size < 2) fprintf(stderr, "allreduce_mpi: run it with mpirun -np N, N >= 2\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  args.ranks = size;
  const std::vector<shardline::bench::AllreduceImpl> impls = {
      {args.label.empty() ? "mpi" : args.label,
       [](float* data, size_t count) {
         return MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD) == MPI_SUCCESS;
       },
       [] { return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS; }}};
  const int code = shardline::bench::RunAllreduceBench(rank, size, args, impls);
  if (code != 0) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  return 0;
}
