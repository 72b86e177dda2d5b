# Unit tests for worker/model/data: tokenizer, datasets, synthetic corpus, sampler.
shardline_test(data_tokenizer_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_tokenizer_test.cc
  LIBS shardline_data LABELS unit TIMEOUT 60)
shardline_test(data_synthetic_corpus_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_synthetic_corpus_test.cc
  LIBS shardline_data LABELS unit TIMEOUT 60)
shardline_test(data_sampler_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_sampler_test.cc
  LIBS shardline_data LABELS unit TIMEOUT 60)
shardline_test(data_gpt2_tokenizer_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_gpt2_tokenizer_test.cc
  LIBS shardline_data nlohmann_json::nlohmann_json LABELS unit TIMEOUT 60)
