# Hugging Face Llama folders in and out (checkpoint/hf_llama.h, hf_llama_export.h) through the
# reader every loader uses: folders that tests/unit/checkpoint_hf_llama_reference.py writes with
# PyTorch (/usr/bin/python3, Debian's python3-torch; transformers is not needed), read box by box,
# their logits against a PyTorch Llama, the export read back bit-exact, bad folders named.
shardline_test(checkpoint_hf_llama_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_hf_llama_test.cc
  LIBS shardline_training nlohmann_json::nlohmann_json LABELS unit TIMEOUT 300)
