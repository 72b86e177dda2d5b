# Tests of monitoring/: metric families, the exposer, and the shipped Grafana/Prometheus files.
get_filename_component(shardline_monitoring_dir ${CMAKE_CURRENT_LIST_DIR}/../../monitoring ABSOLUTE)

shardline_test(monitoring_metrics_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/monitoring_metrics_test.cc
  LIBS shardline_monitoring shardline_monitoring_testing
  LABELS unit TIMEOUT 60)

shardline_test(monitoring_prometheus_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/monitoring_prometheus_test.cc
  LIBS shardline_monitoring shardline_monitoring_testing nlohmann_json::nlohmann_json
  LABELS unit TIMEOUT 60)
target_compile_definitions(monitoring_prometheus_test PRIVATE
  SHARDLINE_MONITORING_DIR="${shardline_monitoring_dir}")

shardline_test(monitoring_dashboard_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/monitoring_dashboard_test.cc
  LIBS shardline_monitoring nlohmann_json::nlohmann_json yaml-cpp
  LABELS unit TIMEOUT 60)
target_compile_definitions(monitoring_dashboard_test PRIVATE
  SHARDLINE_MONITORING_DIR="${shardline_monitoring_dir}")

# The shipped Prometheus files, checked by the real promtool (Debian's prometheus package).
find_program(SHARDLINE_PROMTOOL promtool)
if(SHARDLINE_PROMTOOL)
  add_test(NAME monitoring_promtool_check_config
    COMMAND ${SHARDLINE_PROMTOOL} check config prometheus.yml
    WORKING_DIRECTORY ${shardline_monitoring_dir}/prometheus)
  add_test(NAME monitoring_promtool_check_rules
    COMMAND ${SHARDLINE_PROMTOOL} check rules rules.yml
    WORKING_DIRECTORY ${shardline_monitoring_dir}/prometheus)
  add_test(NAME monitoring_promtool_rules
    COMMAND ${SHARDLINE_PROMTOOL} test rules rules_test.yml
    WORKING_DIRECTORY ${shardline_monitoring_dir}/prometheus)
  set_tests_properties(monitoring_promtool_check_config monitoring_promtool_check_rules
    monitoring_promtool_rules PROPERTIES LABELS unit TIMEOUT 60)
else()
  message(STATUS "promtool not found: the Prometheus config and rules tests are not registered")
endif()

find_program(SHARDLINE_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(SHARDLINE_PYTHON3)
  add_test(NAME monitoring_dashboard_json
    COMMAND ${SHARDLINE_PYTHON3} -m json.tool ${shardline_monitoring_dir}/grafana/shardline-dashboard.json)
  set_tests_properties(monitoring_dashboard_json PROPERTIES LABELS unit TIMEOUT 30)
endif()
