# The coordinator's I/O-free parts, each driven by a manual clock (coordinator/coordinator.h
# lists them).
foreach(part supervisor generation_supervisor scheduler bootstrap progress checkpoint_tracker
        job_history status_view membership kv_store)
  shardline_test(coordinator_${part}_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/coordinator_${part}_test.cc
    LIBS shardline_coordinator LABELS unit)
endforeach()
