shardline_test(training_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/training_test.cc
  LIBS shardline_training LABELS unit TIMEOUT 300)
