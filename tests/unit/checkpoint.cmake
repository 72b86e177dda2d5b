# Unit tests for checkpoint/: safetensors I/O, GPT-2 checkpoints and import, manifests, and
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
# The commit path without a model: names, boxes of flat ranges, assembling shards into a manifest,
# committing a step and retention.
shardline_test(checkpoint_commit_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_commit_test.cc
  LIBS shardline_checkpoint LABELS unit TIMEOUT 60)
# The memory tier's in-place shard writer: its files verify as disk shards and are recycled.
shardline_test(checkpoint_shard_writer_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_shard_writer_test.cc
  LIBS shardline_worker_checkpoint LABELS unit TIMEOUT 60)
# What `shardline train`'s checkpoints guarantee: damage named and skipped, bad input refused,
# bit-exact resume, keep, a crash at every operation of a save, saves off the training loop.
shardline_test(checkpoint_integrity_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_integrity_test.cc
  LIBS shardline_training shardline_forked_world nlohmann_json::nlohmann_json
  LABELS unit TIMEOUT 600)
# Resume equivalence on another plan: 3 steps in plan A, 3 more resumed in plan B, against one
# uninterrupted single-device run; every rank a forked process over real Gloo communicators.
# data.per_site: each site reads only its own file (the others hidden in a mount namespace).
shardline_test(training_federated_data_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/training_federated_data_test.cc
  LIBS shardline_training shardline_forked_world LABELS unit TIMEOUT 180)
shardline_test(checkpoint_resume_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_resume_test.cc
  LIBS shardline_training shardline_forked_world nlohmann_json::nlohmann_json
  LABELS unit TIMEOUT 600)
