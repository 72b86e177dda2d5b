# Unit tests for placement/: specs and their YAML loading.
# The tests find examples/ through SHARDLINE_SOURCE_DIR (set by shardline_test for ctest); the
# compile definition is the fallback when a test binary is run by hand.
set(shardline_placement_source_dir "${CMAKE_CURRENT_LIST_DIR}/../..")
cmake_path(NORMAL_PATH shardline_placement_source_dir)

shardline_test(placement_yaml_reader_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/placement_yaml_reader_test.cc
  LIBS shardline_placement
  LABELS unit)

shardline_test(placement_job_spec_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/placement_job_spec_test.cc
  LIBS shardline_placement
  LABELS unit)
target_compile_definitions(placement_job_spec_test
  PRIVATE SHARDLINE_SOURCE_DIR_DEFAULT="${shardline_placement_source_dir}")

shardline_test(placement_parallel_layout_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/placement_parallel_layout_test.cc
  LIBS shardline_placement
  LABELS unit)

shardline_test(placement_pipeline_schedule_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/placement_pipeline_schedule_test.cc
  LIBS shardline_placement
  LABELS unit)

# The planner's pieces: cluster specs, the cost model (checked against the CPU trainer's own
# allocation, hence shardline_model), and the search.
foreach(test placement_cluster_spec_test placement_planner_test)
  shardline_test(${test}
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/${test}.cc
    LIBS shardline_placement
    LABELS unit)
  target_compile_definitions(${test}
    PRIVATE SHARDLINE_SOURCE_DIR_DEFAULT="${shardline_placement_source_dir}")
endforeach()
shardline_test(placement_cost_model_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/placement_cost_model_test.cc
  LIBS shardline_placement shardline_model
  LABELS unit)
target_compile_definitions(placement_cost_model_test
  PRIVATE SHARDLINE_SOURCE_DIR_DEFAULT="${shardline_placement_source_dir}")

shardline_test(placement_serve_memory_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/placement_serve_memory_test.cc
  LIBS shardline_placement
  LABELS unit)
