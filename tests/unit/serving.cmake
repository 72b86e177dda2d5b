# Serving (worker/serving/): the OpenAI API's parsing and shapes, the HTTP server over real
# loopback sockets with a scripted engine, the batching engine, and `shardline serve` as a process.
shardline_test(serving_openai_api_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/serving_openai_api_test.cc
  LIBS shardline_serving_api nlohmann_json::nlohmann_json LABELS unit TIMEOUT 60)
shardline_test(serving_http_server_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/serving_http_server_test.cc
  LIBS shardline_serving PkgConfig::HTTPLIB nlohmann_json::nlohmann_json LABELS unit TIMEOUT 120)
shardline_test(serving_batching_engine_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/serving_batching_engine_test.cc
  LIBS shardline_serving LABELS unit TIMEOUT 120)
shardline_test(serving_batch_scheduler_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/serving_batch_scheduler_test.cc
  LIBS shardline_serving_scheduler LABELS unit TIMEOUT 120)
shardline_test(serving_sharded_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/serving_sharded_test.cc
  LIBS shardline_serving shardline_forked_world LABELS unit TIMEOUT 300)
shardline_test(serving_cli_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/serving_cli_test.cc
  LIBS shardline_checkpoint shardline_common PkgConfig::HTTPLIB nlohmann_json::nlohmann_json
  LABELS unit TIMEOUT 180)
add_dependencies(serving_cli_test shardline)
