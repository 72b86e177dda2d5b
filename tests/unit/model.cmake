# Unit tests for worker/model: the engine on one rank (config errors, gradients against finite
# differences, training, determinism), KV-cache inference, and a PyTorch reference
# (tests/unit/model_torch_reference.py, run with /usr/bin/python3; skipped when it or torch is
# missing).
shardline_test(model_one_rank_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_one_rank_test.cc
  LIBS shardline_model LABELS unit TIMEOUT 120)
shardline_test(model_inference_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_inference_test.cc
  LIBS shardline_model LABELS unit TIMEOUT 120)
shardline_test(model_torch_reference_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_torch_reference_test.cc
  LIBS shardline_model nlohmann_json::nlohmann_json LABELS unit TIMEOUT 120)
# Sharded execution against the engine on one rank, every rank a forked process over real Gloo
# communicators (15 layouts × up to 8 processes).
shardline_test(model_sharded_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_sharded_test.cc
  LIBS shardline_model shardline_data shardline_forked_world LABELS unit TIMEOUT 600)
# The planner's memory model (placement/cost_model.h) against ShardedGpt's allocator, per rank.
shardline_test(placement_memory_validation_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/placement_memory_validation_test.cc
  LIBS shardline_model shardline_data shardline_forked_world shardline_placement
  LABELS unit TIMEOUT 300)
# The engine on the CUDA backend against the engine on the CPU, and `shardline train` on a CUDA
# device. Labelled `gpu`, as kernels_cuda_test: without a GPU its tests that need one report
# skipped, with the reason.
if(SHARDLINE_CUDA)
  shardline_test(model_engine_cuda_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_engine_cuda_test.cc
    LIBS shardline_training shardline_data shardline_forked_world LABELS gpu TIMEOUT 300)
endif()
# The data-parallel strategy (ZeRO 0-3) on its own: what each stage keeps whole or sharded, where
# an element lives, a gradient's way into the owned shard, and bad stages.
# Buckets reduced while the backward runs (recorded order, real processes).
shardline_test(model_gradient_buckets_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_gradient_buckets_test.cc
  LIBS shardline_model shardline_data shardline_forked_world LABELS unit TIMEOUT 120)
shardline_test(model_data_parallel_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_data_parallel_test.cc
  LIBS shardline_model LABELS unit TIMEOUT 60)
# Compressed gradient sums (PowerSGD, int8 with error feedback) across "hosts" of forked ranks,
# against references in the test and PyTorch's powerSGD_hook
# (tests/unit/model_gradient_compression_reference.py, run with /usr/bin/python3; that case is
# skipped when torch is missing).
shardline_test(model_gradient_compression_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_gradient_compression_test.cc
  LIBS shardline_model LABELS unit TIMEOUT 300)
