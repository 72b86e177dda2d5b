// The shared-memory backend: collectives between ranks of one host through one memory segment,
// with no socket. Buffers are host memory; every dtype and op.
//
// The segment is a memfd that rank 0 creates and the others open through /proc/<pid>/fd: it has no
// name in /dev/shm, so a rank killed at any moment leaves nothing behind, and the memory goes away
// with the last mapping. Layout (shm_communicator.cc): a header, one control line per rank (its own
// cache-line pair, a phase counter published with release and read with acquire), two slots per
// rank for inputs, two shared result slots, and a mailbox per ordered pair for Send/Recv. The two
// slots alternate by phase, so a rank may write its next input while a slow peer still reads the
// last one.
//
// Algorithms: up to `one_shot_bytes`, every rank publishes its input and reduces all of them
// (one phase). Larger all-reduces run one of five (all_reduce_tuner.h), which rank 0 picks per
// size by timing them on the live traffic and tells the others through the segment: the same
// one-shot in chunks; chunked reduce-scatter + all-gather (two phases per chunk: rank r reduces
// slice r of each chunk and the others copy it); either of them with its writes into the segment
// streamed past the writer's caches (faster where a store to a line a peer has read must first
// win it back from the peer's cache, slower where the cores share one); or the single copy, where
// rank r reads slice r of its peers' buffers straight from their memory and the others read its
// result from its buffer: fewer bytes moved. A buffer from SharedHostAllocator
// (shared_host_memory.h) is read through the reader's own mapping of it; any other through
// process_vm_readv (OpenMPI's CMA path), if every rank may read every peer (found out on its first
// run; never again otherwise). Whichever runs, every element is reduced in rank order 0, 1, ...,
// n-1, so every rank gets bit-identical results, whatever the choice. bf16 and f16 are reduced in
// f32 and rounded once.
//
// Waiting spins briefly, then yields, then sleeps on a futex in the segment with a deadline. Every
// wait checks the abort word (any rank's Abort() fails every rank's pending and later operations)
// and its peers' liveness through pidfds, so a dead peer is an Unavailable within milliseconds and
// a stopped one a DeadlineExceeded that says so, never a hang. After any failed operation the
// communicator is broken for good, as Gloo's is: the caller builds a new one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/comm/all_reduce_tuner.h"
#include "worker/comm/communicator.h"

namespace shardline::comm {

struct ShmOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // per operation and bootstrap
  // Bytes per input slot: the chunk of a large all-reduce per rank. 0 picks the default.
  size_t slot_bytes = 0;
  // All-reduces up to this size always run the one-phase algorithm (latency-bound: one phase
  // beats two wherever measured). SIZE_MAX: always; 0: never.
  size_t one_shot_bytes = 16 * 1024;
  // Above one_shot_bytes: nullopt lets rank 0 choose by timing (AllReduceTuner); an algorithm
  // forces it (tests, benchmarks). A forced single copy where ranks may not read each other runs
  // chunked.
  std::optional<ShmAlgorithm> all_reduce;
};

// The identity of the shared-memory domain this process is in: same kernel boot, same pid, IPC and
// network namespaces. Two ranks with the same identity can share a segment; network namespaces
// count because a namespaced host (tests/support) stands for another machine.
std::string LocalHostIdentity();

// Maps one segment among `size` ranks of this host through `store` (every rank calls it with the
// same store prefix). InvalidArgument for a bad rank; DeadlineExceeded naming the missing ranks.
absl::StatusOr<std::unique_ptr<Communicator>> CreateShmCommunicator(Store& store, int rank,
                                                                    int size,
                                                                    const ShmOptions& options);

}  // namespace shardline::comm
