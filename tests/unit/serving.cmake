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
  LIBS shardline_serving_rank shardline_forked_world LABELS unit TIMEOUT 300)
shardline_test(serving_cli_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/serving_cli_test.cc
  LIBS shardline_checkpoint shardline_data shardline_common PkgConfig::HTTPLIB nlohmann_json::nlohmann_json
  LABELS unit TIMEOUT 180)
add_dependencies(serving_cli_test shardline)
# OpenAI's official Python client against `shardline serve` (serving_openai_client.py, run with
# /usr/bin/python3), and curl -N on the raw stream. The client comes from scripts/install-deps.sh,
# in SHARDLINE_OPENAI_CLIENT_DIR; without it the test fails, saying so.
set(SHARDLINE_OPENAI_CLIENT_DIR "/opt/shardline/deps/openai-client" CACHE PATH
    "Prefix holding OpenAI's Python client (PyPI openai) and its dependencies, for the serving \
conformance test (scripts/install-deps.sh installs them there)")
if(NOT EXISTS "${SHARDLINE_OPENAI_CLIENT_DIR}/VERSION")
  message(WARNING "no OpenAI Python client in ${SHARDLINE_OPENAI_CLIENT_DIR} (run "
    "scripts/install-deps.sh, or set SHARDLINE_OPENAI_CLIENT_DIR): "
    "serving_openai_client_test will fail")
endif()
shardline_test(serving_openai_client_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/serving_openai_client_test.cc
  LIBS shardline_checkpoint shardline_common PkgConfig::HTTPLIB nlohmann_json::nlohmann_json
  LABELS unit TIMEOUT 120)
target_compile_definitions(serving_openai_client_test PRIVATE
  SHARDLINE_OPENAI_CLIENT_DIR="${SHARDLINE_OPENAI_CLIENT_DIR}")
add_dependencies(serving_openai_client_test shardline)
# Models' chat templates (worker/serving/chat_template.h): real templates (chat_templates/) against
# their expected prompts and against transformers' way of rendering them
# (serving_chat_template_reference.py, run with /usr/bin/python3 and Debian's python3-jinja2).
shardline_test(serving_chat_template_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/serving_chat_template_test.cc
  LIBS shardline_serving_chat shardline_common nlohmann_json::nlohmann_json LABELS unit TIMEOUT 120)
