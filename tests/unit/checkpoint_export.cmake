# Exporting a model as a Hugging Face GPT-2 folder (checkpoint/gpt2_hf_export.h) and reading it
# back through ImportHfGpt2 and LoadModel, with the models of worker/model/ as the weights. The
# check against the real transformers is bench/hf_export_check.py, outside ctest.
shardline_test(checkpoint_hf_export_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_hf_export_test.cc
  LIBS shardline_training nlohmann_json::nlohmann_json LABELS unit TIMEOUT 120)
