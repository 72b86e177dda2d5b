# `shardline generate`'s tokenizer (--tokenizer, and a Hugging Face folder's own files), run as the
# binary a user runs.
shardline_test(cli_generate_tokenizer_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cli_generate_tokenizer_test.cc
  LIBS shardline_checkpoint shardline_data shardline_common nlohmann_json::nlohmann_json
  LABELS unit TIMEOUT 120)
add_dependencies(cli_generate_tokenizer_test shardline)
