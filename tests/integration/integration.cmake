# Multi-process tests: real coordinator, agents and actors of the built `shardline` binary.
add_library(shardline_test_cluster ${CMAKE_CURRENT_LIST_DIR}/local_cluster.cc)
target_link_libraries(shardline_test_cluster PUBLIC shardline_cli)
target_compile_definitions(shardline_test_cluster PRIVATE
  SHARDLINE_BINARY_PATH="$<TARGET_FILE:shardline>" SHARDLINE_SOURCE_PATH="${CMAKE_SOURCE_DIR}")

# The actor with a fault hook (tests/support/stopping_actor_main.cc): a test's agent runs it in
# place of `shardline actor` (--actor-binary), so the product reads no fault switches.
add_executable(shardline_stopping_actor ${CMAKE_SOURCE_DIR}/tests/support/stopping_actor_main.cc)
target_link_libraries(shardline_stopping_actor PRIVATE shardline_worker CLI11::CLI11)

foreach(name cluster_comm_check_test cluster_fault_test cluster_bad_input_test cluster_security_test
    up_test train_cli_test)
  shardline_test(${name}
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/${name}.cc
    LIBS shardline_test_cluster shardline_monitoring_testing shardline_comm
    LABELS integration TIMEOUT 600)
  add_dependencies(${name} shardline)
endforeach()
# cluster_fault_test's agents run shardline_stopping_actor for their actors where a rank must stop
# itself, unless $SHARDLINE_STOPPING_ACTOR names another.
add_dependencies(cluster_fault_test shardline_stopping_actor)
target_compile_definitions(cluster_fault_test PRIVATE
  SHARDLINE_STOPPING_ACTOR_PATH="$<TARGET_FILE:shardline_stopping_actor>")

# The coordinator's side of train jobs, against fake actors and a fake node over the real wire;
# it reads the committed manifests back with the checkpoint library.
shardline_test(cluster_train_coordinator_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_train_coordinator_test.cc
  LIBS shardline_test_cluster shardline_monitoring_testing shardline_checkpoint shardline_placement
  LABELS integration TIMEOUT 600)
add_dependencies(cluster_train_coordinator_test shardline)

# A sharded train job end to end (tp×pp and ZeRO 3 × pp) against `shardline train` on one device.
shardline_test(cluster_train_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_train_test.cc
  LIBS shardline_test_cluster shardline_monitoring_testing shardline_training
  LABELS integration TIMEOUT 900)
add_dependencies(cluster_train_test shardline)

# Planning on a live cluster: start-up calibration in `status --json`, `parallel: auto` jobs
# planned and run, and `shardline plan` for a file and for the live cluster.
shardline_test(cluster_plan_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_plan_test.cc
  LIBS shardline_test_cluster shardline_monitoring_testing
  LABELS integration TIMEOUT 300)
add_dependencies(cluster_plan_test shardline)

# The planner's step-time prediction on live local CPU jobs (one job per layout): calibrated,
# priced and shown next to the measured step. Not RUN_SERIAL: it asserts nothing about time (how
# close the two are is bench/step_time_prediction_bench.cc's), so a loaded machine changes only
# the figures it shows, as for cluster_plan_test and cluster_train_test beside it.
shardline_test(cluster_step_time_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_step_time_test.cc
  LIBS shardline_test_cluster shardline_monitoring_testing
  LABELS integration TIMEOUT 600)
add_dependencies(cluster_step_time_test shardline)

# Checkpoints across `shardline train` and cluster jobs: resume on another plan and back, a
# damaged step skipped and shown in status, a spec refused before spawning, kill -9 of a rank in
# the middle of its save.
shardline_test(cluster_checkpoint_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_checkpoint_test.cc
  LIBS shardline_test_cluster shardline_monitoring_testing shardline_training
  LABELS integration TIMEOUT 600)
add_dependencies(cluster_checkpoint_test shardline)

# The generation supervisor: a killed or stopped actor, a lost node that returns, a crash loop, a
# coordinator killed mid-job; elastic jobs restart from their last commit and end like a
# fault-free run.
shardline_test(cluster_elastic_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_elastic_test.cc
  LIBS shardline_test_cluster shardline_monitoring_testing shardline_training
  LABELS integration TIMEOUT 900)
add_dependencies(cluster_elastic_test shardline)

# The memory tier: a killed actor resumes from the nodes' memory at the step it reached, a cut
# host's files come from their replicas, a coordinator restart falls back to disk; each ends like
# a fault-free run.
shardline_test(cluster_memory_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_memory_test.cc
    ${CMAKE_SOURCE_DIR}/tests/support/net_namespaces.cc
  LIBS shardline_test_cluster shardline_monitoring_testing shardline_training
  LABELS integration TIMEOUT 900)
add_dependencies(cluster_memory_test shardline)

# Several hosts: agents in network namespaces of their own (root; skipped with the reason when
# namespaces cannot be made), a link cut and restored mid-training.
shardline_test(cluster_multihost_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_multihost_test.cc
    ${CMAKE_SOURCE_DIR}/tests/support/net_namespaces.cc
  LIBS shardline_test_cluster shardline_monitoring_testing
  LABELS integration TIMEOUT 600)
add_dependencies(cluster_multihost_test shardline)

# Slow links: a Gloo all-reduce between two namespaced hosts, its bytes against the link's
# counters, then shaped with tc to 100 Mbit (skipped with the reason where namespaces or tc cannot
# be made); a dp = 2 Gloo train job's bytes per step in status. Not RUN_SERIAL: the bound on the
# shaped all-reduce is a lower one, which load cannot break; the unshaped run need only be twice
# as fast as the shaped one, where it is some ten times faster.
shardline_test(cluster_slow_link_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_slow_link_test.cc
    ${CMAKE_SOURCE_DIR}/tests/support/net_namespaces.cc
  LIBS shardline_test_cluster shardline_monitoring_testing shardline_comm shardline_placement
  LABELS integration TIMEOUT 600)
add_dependencies(cluster_slow_link_test shardline)

# The chaos driver: ten seeded faults of every class in one elastic job, which ends like a
# fault-free run (bench/chaos_bench.cc runs 100).
shardline_test(cluster_chaos_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_chaos_test.cc ${CMAKE_SOURCE_DIR}/tests/support/chaos.cc
    ${CMAKE_SOURCE_DIR}/tests/support/net_namespaces.cc
  LIBS shardline_test_cluster shardline_monitoring_testing shardline_training
  LABELS integration TIMEOUT 900)
add_dependencies(cluster_chaos_test shardline)

# `kind: serve` on a real cluster, reached over HTTP (cpp-httplib's client), against `shardline
# generate`'s text; a killed actor and the supervisor's restart.
shardline_test(cluster_serve_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_serve_test.cc
  LIBS shardline_test_cluster shardline_monitoring_testing shardline_checkpoint PkgConfig::HTTPLIB
  LABELS integration TIMEOUT 600)
add_dependencies(cluster_serve_test shardline)
