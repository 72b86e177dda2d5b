// Chooses the shared-memory all-reduce's algorithm per message size by timing them as they run.
//
// Which one is fastest depends on the machine and changes while it runs: on a 2-core AVX-512
// Xeon the single copy won from 4 MiB and lost at 1 MiB; on a 2-vCPU EPYC VM the copying
// algorithms won in cache whenever the two vCPUs shared an L3, and the single copy won at the
// same sizes in the runs where the hypervisor had put them apart (2-5x slower for every
// implementation, OpenMPI's too). Fixed thresholds are right on one of these and wrong on the
// other, so rank 0 times every candidate on the live traffic, runs the fastest, and retries the
// others now and then to follow the machine (NCCL tunes by a model, UCC by a table per machine;
// neither follows a host that changes under it). The choice never changes results: every
// algorithm reduces in rank order (shm_communicator.h).
//
// Pure bookkeeping, no I/O, no clocks: the communicator measures and passes seconds in.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace shardline::comm {

enum class ShmAlgorithm : uint8_t {
  kOneShot = 0,     // every rank copies its input into the segment and reduces all of them
  kChunked = 1,     // reduce-scatter + all-gather through the segment
  kSingleCopy = 2,  // reduce-scatter + all-gather reading the peers' buffers (process_vm_readv)
  // The first two with their writes into the segment streamed past this core's caches: slower
  // where the cores share a cache, much faster where a store to a line a peer has read waits for
  // the peer to give it up (shm_communicator.cc, StreamCopy).
  kOneShotStreamed = 3,
  kChunkedStreamed = 4,
};
constexpr int kShmAlgorithms = 5;
const char* ShmAlgorithmName(ShmAlgorithm algorithm);

class AllReduceTuner {
 public:
  // Sizes are tuned in powers of two: bucket b holds [2^b, 2^(b+1)) bytes.
  static constexpr int kBuckets = 48;
  // Each candidate's first run warms its pages and is not counted; the second is its estimate.
  static constexpr int kWarmRuns = 2;
  // One run in this many (per bucket) retries the candidate tried least recently: with a
  // candidate twice as slow as the best, the retries cost ~1/kRetryEvery of the time.
  static constexpr uint64_t kRetryEvery = 32;

  static int Bucket(size_t bytes);

  // The algorithm the next all-reduce in `bucket` is to run.
  ShmAlgorithm Next(int bucket) const;
  // An all-reduce in `bucket` ran `algorithm` in `seconds` (on this rank, entry to return).
  // True when that changed the bucket's fastest algorithm once every candidate has warmed up
  // (worth a log line).
  bool Record(int bucket, ShmAlgorithm algorithm, double seconds);
  // The algorithm cannot run here (the single copy where ranks may not read each other).
  void Disallow(ShmAlgorithm algorithm);
  bool allowed(ShmAlgorithm algorithm) const { return allowed_[Index(algorithm)]; }
  // All-reduces recorded in `bucket`; Next of a bucket with none is kOneShot.
  uint64_t runs(int bucket) const { return buckets_[bucket].runs; }

  // The fastest by the estimates so far, among the allowed candidates with an estimate (kOneShot
  // when none has one yet).
  ShmAlgorithm Best(int bucket) const;
  double estimate(int bucket, ShmAlgorithm algorithm) const {
    return buckets_[bucket].arms[Index(algorithm)].estimate;
  }

 private:
  static int Index(ShmAlgorithm algorithm) { return static_cast<int>(algorithm); }
  struct Arm {
    double estimate = 0;  // seconds, an exponentially weighted mean of the counted runs
    int runs = 0;
    uint64_t last_run = 0;  // the bucket's run number when this one last ran
  };
  struct Slot {
    std::array<Arm, kShmAlgorithms> arms;
    uint64_t runs = 0;
  };
  std::array<Slot, kBuckets> buckets_{};
  std::array<bool, kShmAlgorithms> allowed_{true, true, true, true, true};
};

}  // namespace shardline::comm
