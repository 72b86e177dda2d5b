shardline_test(training_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/training_test.cc
  LIBS shardline_training LABELS unit TIMEOUT 300)
# Loading a GPT from sharded checkpoints (and boxes of it from any checkpoint): worker/training's
# model_checkpoint over worker/checkpoint's ShardedReader.
shardline_test(checkpoint_sharded_model_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_sharded_model_test.cc
  LIBS shardline_training LABELS unit TIMEOUT 120)
