# Unit tests for worker/checkpoint: safetensors I/O, GPT-2 checkpoints and import, manifests, and
# reading sharded checkpoints by boxes.
# checkpoint_safetensors_test runs tests/unit/checkpoint_reference.py with /usr/bin/python3
# (PyTorch); it finds the script through SHARDLINE_SOURCE_DIR or the compiled-in source path.
shardline_test(checkpoint_safetensors_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_safetensors_test.cc
  LIBS shardline_checkpoint nlohmann_json::nlohmann_json LABELS unit TIMEOUT 120)
shardline_test(checkpoint_gpt2_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_gpt2_test.cc
  LIBS shardline_checkpoint LABELS unit TIMEOUT 60)
shardline_test(checkpoint_manifest_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_manifest_test.cc
  LIBS shardline_checkpoint LABELS unit TIMEOUT 60)
shardline_test(checkpoint_sharded_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_sharded_test.cc
  LIBS shardline_checkpoint LABELS unit TIMEOUT 60)
