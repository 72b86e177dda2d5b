// A communicator group of processes on this host with no coordinator (`shardline serve --tp T
// --pp P`): rank 0 makes a store directory, spawns ranks 1..T·P-1 (any program; usually its own
// binary as a hidden subcommand), waits until each says it is ready (has loaded what it needs)
// while watching that none has died, and then every rank joins its world, tensor-parallel and
// pipeline groups of placement::RankGrid(T, P, 1) through the directory (CreateCpuCommunicator:
// shared memory on one host; one key prefix per group id). A follower that exits before it is
// ready fails the join at once, naming its rank, instead of leaving rank 0 in a bootstrap timeout.
//
// The followers are rank 0's children and die with it (SpawnOptions::die_with_parent); the store
// directory goes when the group does. Rank 0's methods are not thread-safe: call them all from
// the thread that started the group (the parent-death signal watches that thread).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/process.h"
#include "placement/parallel_layout.h"
#include "worker/comm/communicator.h"
#include "worker/comm/cpu_communicator.h"
#include "worker/comm/store.h"

namespace shardline::comm {

// One rank's communicators in the group's layout (null: a group of one rank): `world` holds every
// rank, `tp` the ranks of this rank's pipeline stage, `pp` the ranks of its tensor-parallel index,
// one per stage in stage order (placement::RankGrid's groups; the group rank is the index there).
struct RankCommunicators {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> pp;
};

struct LocalRankGroupOptions {
  // The layout: tp · pp ranks, as placement::RankGrid::Create(tp, pp, 1) numbers them.
  int tp = 1;
  int pp = 1;
  // The command line of follower `rank` (1 <= rank < tp · pp); it must call JoinLocalRankGroup
  // with `store_dir`, its rank and the same layout.
  std::function<std::vector<std::string>(int rank, const std::string& store_dir)> command;
  std::vector<std::pair<std::string, std::string>> extra_env;  // of every follower
  // How long Join waits for the followers to be ready (their loading included).
  std::chrono::milliseconds ready_timeout{std::chrono::minutes(10)};
  // The bootstrap's and every operation's timeouts; the followers must use the same.
  CpuCommOptions comm;
  std::string temp_root = "/tmp";  // the store directory is made in here
  // How a follower is started; tests pass a fake.
  std::function<absl::StatusOr<pid_t>(const SpawnOptions&)> spawn = Spawn;
};

// Rank 0's side of the group.
class LocalRankGroup {
 public:
  // Makes the store directory and spawns ranks 1..size-1 (none for a size of 1). InvalidArgument
  // for a tp or pp below 1 (RankGrid::Create's message); Internal when the directory or a process
  // cannot be made (the followers already started are killed).
  static absl::StatusOr<std::unique_ptr<LocalRankGroup>> Start(LocalRankGroupOptions options);
  // Kills and reaps every follower still running, then removes the store directory.
  ~LocalRankGroup();
  LocalRankGroup(const LocalRankGroup&) = delete;
  LocalRankGroup& operator=(const LocalRankGroup&) = delete;

  // Waits until every follower is ready, then joins rank 0's groups (world, tp, pp, in that order,
  // as every rank does) and returns its communicators (owned by the group; all null for a size of
  // 1). Unavailable naming the rank and how it ended when a follower exits first;
  // DeadlineExceeded naming the ranks not ready after ready_timeout; Cancelled once `cancel` is
  // true; a bootstrap's error names the group. Call once.
  absl::StatusOr<const RankCommunicators*> Join(const std::atomic<bool>& cancel);

  // OK while every follower runs; Unavailable naming the first one found to have exited, and how
  // ("rank 1 exited: killed by SIGKILL (signal 9)"). Does not block.
  absl::Status CheckFollowers();

  // After the followers were told to stop: waits up to `grace` for each to exit, then kills the
  // rest. OK when every follower exited with 0; else Unavailable naming each that did not.
  absl::Status Finish(std::chrono::milliseconds grace);

  int size() const { return grid_.world(); }
  const placement::RankGrid& grid() const { return grid_; }
  const std::string& store_dir() const { return store_dir_; }

 private:
  struct Follower {
    int rank = 0;
    pid_t pid = -1;
    bool reaped = false;
    ExitStatus exit;
  };
  LocalRankGroup(placement::RankGrid grid, std::string store_dir, LocalRankGroupOptions options)
      : grid_(grid), store_dir_(std::move(store_dir)), options_(std::move(options)) {}
  // Reaps the followers that have exited; the first of them not yet reported, if any.
  const Follower* ReapExited();
  void KillAll();

  const placement::RankGrid grid_;
  const std::string store_dir_;
  const LocalRankGroupOptions options_;
  std::unique_ptr<Store> store_;
  std::vector<Follower> followers_;  // ranks 1..size-1
  RankCommunicators communicators_;
};

// A follower's side, in the process rank 0 spawned: tells rank 0 this rank is ready, then joins
// its groups of `grid` (rank 0's layout; the same `options` as rank 0's) and returns its
// communicators. InvalidArgument for a rank outside [1, grid.world()); the bootstrap's errors,
// naming the rank and the group.
absl::StatusOr<RankCommunicators> JoinLocalRankGroup(const std::string& store_dir, int rank,
                                                     const placement::RankGrid& grid,
                                                     const CpuCommOptions& options);

}  // namespace shardline::comm
