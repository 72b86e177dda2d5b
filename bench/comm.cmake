# All-reduce benchmarks: Shardline's GlooCommunicator, raw Gloo, OpenMPI. Not part of ctest;
# bench/allreduce_compare.py runs them and prints one table.
# Shardline's GlooCommunicator and raw Gloo, interleaved in the same forked processes.
add_executable(allreduce_gloo ${CMAKE_CURRENT_LIST_DIR}/allreduce_gloo.cc)
target_link_libraries(allreduce_gloo PRIVATE shardline_comm gloo)

if(MPI_CXX_FOUND)
  add_executable(allreduce_mpi ${CMAKE_CURRENT_LIST_DIR}/allreduce_mpi.cc)
  target_link_libraries(allreduce_mpi PRIVATE MPI::MPI_CXX shardline_comm)
endif()
