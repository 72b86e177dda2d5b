# The coordinator's I/O-free parts, driven by a manual clock.
shardline_test(coordinator_supervisor_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/coordinator_supervisor_test.cc
  LIBS shardline_coordinator LABELS unit)
