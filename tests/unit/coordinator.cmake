# The coordinator's I/O-free parts, each driven by a manual clock (coordinator/coordinator.h
# lists them).
foreach(part supervisor generation_supervisor scheduler bootstrap progress checkpoint_tracker
        job_history status_view membership kv_store)
  shardline_test(coordinator_${part}_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/coordinator_${part}_test.cc
    LIBS shardline_coordinator LABELS unit)
endforeach()

# The layout on the wire, written by the coordinator and read by the actor: the actor's reader
# is compiled in (it is one small file of shardline_worker, which links the engine).
shardline_test(coordinator_layout_wire_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/coordinator_layout_wire_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/../../worker/actor/layout_wire.cc
  LIBS shardline_coordinator LABELS unit)
