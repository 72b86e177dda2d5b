# Unit tests for model/: the config's choices, checks and metadata form, and the tensor table
# (rows per family, tensor-parallel boxes, parameter counts).
shardline_test(model_description_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_description_test.cc
  LIBS shardline_model_description shardline_checkpoint LABELS unit TIMEOUT 60)
