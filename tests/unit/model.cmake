# Unit tests for worker/model: config errors, gradients against finite differences, training,
# determinism, KV-cache inference, and a PyTorch reference (tests/unit/model_torch_reference.py,
# run with /usr/bin/python3; skipped when it or torch is missing).
shardline_test(model_gpt_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_gpt_test.cc
  LIBS shardline_model LABELS unit TIMEOUT 120)
shardline_test(model_inference_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_inference_test.cc
  LIBS shardline_model LABELS unit TIMEOUT 120)
shardline_test(model_torch_reference_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_torch_reference_test.cc
  LIBS shardline_model nlohmann_json::nlohmann_json LABELS unit TIMEOUT 120)
