shardline_test(protocol_envelope_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/protocol_envelope_test.cc
  LIBS shardline_protocol LABELS unit)
shardline_test(protocol_channel_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/protocol_channel_test.cc
  LIBS shardline_protocol LABELS unit)
shardline_test(protocol_curve_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/protocol_curve_test.cc
  LIBS shardline_protocol LABELS unit)
