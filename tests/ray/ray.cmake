# The Ray launcher (python/shardline_ray) against a real Ray from PyPI, on loopback: a one-node
# cluster through `ray job submit` (and `ray job stop`), an elastic job that loses a node of Ray's
# multi-node test cluster and gets it back, a cluster too small for the job, and the spec reader.
# Run with the Python of the Ray venv that scripts/install-deps.sh makes (SHARDLINE_RAY_VENV);
# without it the tests fail, saying so. They skip (exit 77) only when Ray cannot start at all.
set(SHARDLINE_RAY_VENV "/opt/shardline/deps/ray-venv" CACHE PATH
    "Virtual environment holding Ray (PyPI ray[default]) for the Ray launcher's tests \
(scripts/install-deps.sh makes it)")
set(shardline_ray_python "${SHARDLINE_RAY_VENV}/bin/python")
if(NOT EXISTS "${SHARDLINE_RAY_VENV}/VERSION")
  message(WARNING "no Ray venv in ${SHARDLINE_RAY_VENV} (run scripts/install-deps.sh, or set "
    "SHARDLINE_RAY_VENV): the ray_* tests will fail")
endif()

foreach(test_name IN ITEMS spec single_node elastic bad_input)
  if(test_name STREQUAL "spec")
    set(script "${CMAKE_CURRENT_LIST_DIR}/shardline_ray_spec_test.py")
  else()
    set(script "${CMAKE_CURRENT_LIST_DIR}/ray_${test_name}_test.py")
  endif()
  add_test(NAME ray_${test_name}
    COMMAND sh -c "test -x '${shardline_ray_python}' || { echo 'no Ray venv at \
${SHARDLINE_RAY_VENV} (run scripts/install-deps.sh, or set SHARDLINE_RAY_VENV)'; exit 1; }; \
exec '${shardline_ray_python}' '${script}'"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  # The tree's launcher first on PYTHONPATH (before the venv's .pth); no __pycache__ in the tree.
  set_tests_properties(ray_${test_name} PROPERTIES
    ENVIRONMENT "SHARDLINE_BINARY=$<TARGET_FILE:shardline>;SHARDLINE_SOURCE_DIR=${CMAKE_SOURCE_DIR};\
PYTHONPATH=${CMAKE_SOURCE_DIR}/python:${CMAKE_CURRENT_LIST_DIR};\
PYTHONDONTWRITEBYTECODE=1"
    SKIP_RETURN_CODE 77)
endforeach()
set_tests_properties(ray_spec PROPERTIES LABELS "unit;ray" TIMEOUT 60)
# A Ray cluster is a dozen processes: one such test at a time beside the rest of the suite.
set_tests_properties(ray_single_node ray_elastic ray_bad_input PROPERTIES
  LABELS "integration;ray" RESOURCE_LOCK ray_cluster)
set_tests_properties(ray_single_node PROPERTIES TIMEOUT 300)
set_tests_properties(ray_elastic PROPERTIES TIMEOUT 420)
set_tests_properties(ray_bad_input PROPERTIES TIMEOUT 180)
