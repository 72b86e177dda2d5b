# Communicator tests (worker/comm).
shardline_test(comm_store_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_store_test.cc
  LIBS shardline_comm LABELS unit TIMEOUT 60)
shardline_test(comm_collectives_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_collectives_test.cc
  LIBS shardline_comm gloo LABELS unit TIMEOUT 300)
shardline_test(comm_shm_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_shm_test.cc
  LIBS shardline_comm LABELS unit TIMEOUT 300)
if(SHARDLINE_CUDA)
  shardline_test(comm_nccl_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_nccl_test.cc
    LIBS shardline_comm shardline_nccl LABELS unit TIMEOUT 120)
endif()
shardline_test(comm_all_reduce_tuner_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_all_reduce_tuner_test.cc
  LIBS shardline_comm LABELS unit)
shardline_test(comm_shared_host_memory_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_shared_host_memory_test.cc
  LIBS shardline_comm LABELS unit)
shardline_test(comm_local_rank_group_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_local_rank_group_test.cc
  LIBS shardline_comm LABELS unit TIMEOUT 60)
# A host communicator carrying a backend's buffers (comm::StagedCommunicator), in forked ranks.
shardline_test(comm_staged_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_staged_test.cc
  LIBS shardline_comm shardline_forked_world LABELS unit TIMEOUT 120)
