# deploy/kubernetes/ checked without a cluster (tests/deploy/): the manifests validated offline
# against the Kubernetes API's schemas and rules, bad manifests refused naming the field, and the
# containers' commands run as local processes with the environment the manifests give them.
# kubernetes-validate (its schemas) and PyYAML come from scripts/install-deps.sh, in
# SHARDLINE_KUBERNETES_VALIDATE_DIR; without them these tests fail, saying so.
find_program(SHARDLINE_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
set(SHARDLINE_KUBERNETES_VALIDATE_DIR "/opt/shardline/deps/kubernetes-validate" CACHE PATH
    "Prefix holding kubernetes-validate (PyPI) and its dependencies, for the deploy/kubernetes \
tests (scripts/install-deps.sh installs them there)")
if(NOT EXISTS "${SHARDLINE_KUBERNETES_VALIDATE_DIR}/VERSION")
  message(WARNING "no kubernetes-validate in ${SHARDLINE_KUBERNETES_VALIDATE_DIR} (run "
    "scripts/install-deps.sh, or set SHARDLINE_KUBERNETES_VALIDATE_DIR): "
    "the deploy_kubernetes tests will fail")
endif()
if(SHARDLINE_PYTHON3)
  set(deploy_args --source ${CMAKE_SOURCE_DIR}
      --validate-prefix ${SHARDLINE_KUBERNETES_VALIDATE_DIR})
  add_test(NAME deploy_kubernetes_schemas
    COMMAND ${SHARDLINE_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/validate_manifests.py ${deploy_args} schemas)
  add_test(NAME deploy_kubernetes_bad_input
    COMMAND ${SHARDLINE_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/validate_manifests.py ${deploy_args} bad-input)
  # The binary under test unless $SHARDLINE_BINARY says otherwise (as the C++ tests).
  add_test(NAME deploy_kubernetes_local_run
    COMMAND ${SHARDLINE_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/run_manifests_locally.py ${deploy_args}
      --binary $<TARGET_FILE:shardline>)
  set_tests_properties(deploy_kubernetes_schemas deploy_kubernetes_bad_input
    PROPERTIES LABELS deploy TIMEOUT 60)
  set_tests_properties(deploy_kubernetes_local_run PROPERTIES LABELS deploy TIMEOUT 90)
else()
  message(WARNING "no /usr/bin/python3: the deploy_kubernetes tests are not registered")
endif()
