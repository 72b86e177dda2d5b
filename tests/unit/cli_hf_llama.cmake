# A Hugging Face Llama folder given to the binary a user runs: generate, serve (one process and
# --tp 2) and `checkpoint export --format hf` against the greedy text of a PyTorch Llama
# (tests/unit/checkpoint_hf_llama_reference.py, /usr/bin/python3 with Debian's python3-torch).
shardline_test(cli_hf_llama_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cli_hf_llama_test.cc
  LIBS shardline_training shardline_common PkgConfig::HTTPLIB nlohmann_json::nlohmann_json
  LABELS unit TIMEOUT 300)
add_dependencies(cli_hf_llama_test shardline)
