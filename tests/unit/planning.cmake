# Planning and its integration: the actor's start-up calibration, the coordinator's calibration
# book and the ClusterSpec it builds, and `shardline plan` (its options, the train set-up YAML,
# its output).
shardline_test(actor_calibration_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/actor_calibration_test.cc
  LIBS shardline_worker LABELS unit TIMEOUT 120)
shardline_test(coordinator_calibration_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/coordinator_calibration_test.cc
  LIBS shardline_coordinator LABELS unit)
shardline_test(cli_plan_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cli_plan_test.cc
  LIBS shardline_cli LABELS unit)
