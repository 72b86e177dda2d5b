#include "worker/comm/local_rank_group.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/comm/file_store.h"

namespace shardline::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Keys of the group's store: a follower's readiness, and each communicator's bootstrap under the
// prefix of its group id ("world", "tp-d0-p1", "pp-t1-d0").
std::string ReadyKey(int rank) { return "ready/" + std::to_string(rank); }

// Joins `rank`'s groups of `grid` through `store`, in GroupsOf's order (world, tp, pp), which is
// the same on every rank, so no two ranks wait on each other's later group.
absl::StatusOr<RankCommunicators> JoinGroups(Store& store, const placement::RankGrid& grid,
                                             int rank, const CpuCommOptions& options) {
  RankCommunicators communicators;
  for (const placement::CommGroup& group : grid.GroupsOf(rank)) {
    // A group of one has no communicator; dp is always one here (RankGrid(tp, pp, 1)).
    if (group.ranks.size() == 1) continue;
    const int index = static_cast<int>(std::find(group.ranks.begin(), group.ranks.end(), rank) -
                                       group.ranks.begin());
    PrefixStore prefixed(group.id, store);
    absl::StatusOr<std::unique_ptr<Communicator>> communicator =
        CreateCpuCommunicator(prefixed, index, static_cast<int>(group.ranks.size()), options);
    if (!communicator.ok()) {
      return Annotate(communicator.status(), absl::StrCat("group ", group.id));
    }
    if (group.kind == "world") communicators.world = std::move(*communicator);
    if (group.kind == "tp") communicators.tp = std::move(*communicator);
    if (group.kind == "pp") communicators.pp = std::move(*communicator);
  }
  return communicators;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalRankGroup>> LocalRankGroup::Start(
    LocalRankGroupOptions options) {
  absl::StatusOr<placement::RankGrid> grid = placement::RankGrid::Create(options.tp, options.pp, 1);
  if (!grid.ok()) return grid.status();
  std::string dir = options.temp_root + "/shardline-group-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("making a store directory in ", options.temp_root, ": ",
                                            std::strerror(errno)));
  }
  const int size = grid->world();
  std::unique_ptr<LocalRankGroup> group(new LocalRankGroup(*grid, dir, std::move(options)));
  ASSIGN_OR_RETURN(group->store_, FileStore::Open(dir));
  for (int rank = 1; rank < size; ++rank) {
    SpawnOptions spawn;
    spawn.argv = group->options_.command(rank, dir);
    spawn.extra_env = group->options_.extra_env;
    spawn.die_with_parent = true;
    absl::StatusOr<pid_t> pid = group->options_.spawn(spawn);
    // The group's destructor kills the followers started so far and removes the directory.
    if (!pid.ok()) return Annotate(pid.status(), absl::StrCat("starting rank ", rank));
    group->followers_.push_back(Follower{.rank = rank, .pid = *pid, .reaped = false, .exit = {}});
  }
  return group;
}

LocalRankGroup::~LocalRankGroup() {
  KillAll();
  communicators_ = {};
  std::error_code ignored;
  std::filesystem::remove_all(store_dir_, ignored);
}

const LocalRankGroup::Follower* LocalRankGroup::ReapExited() {
  const Follower* first = nullptr;
  for (Follower& f : followers_) {
    if (!f.reaped) {
      absl::StatusOr<std::optional<ExitStatus>> exit = TryReap(f.pid);
      if (!exit.ok() || !exit->has_value()) continue;  // running (or not ours to reap)
      f.reaped = true;
      f.exit = **exit;
    }
    if (first == nullptr) first = &f;
  }
  return first;
}

void LocalRankGroup::KillAll() {
  for (Follower& f : followers_) {
    if (f.reaped) continue;
    ::kill(f.pid, SIGKILL);
    absl::StatusOr<std::optional<ExitStatus>> exit = WaitFor(f.pid, std::chrono::seconds(10));
    f.reaped = true;
    f.exit =
        exit.ok() && exit->has_value() ? **exit : ExitStatus{.signaled = true, .code = SIGKILL};
  }
}

absl::Status LocalRankGroup::CheckFollowers() {
  if (const Follower* f = ReapExited()) {
    return absl::UnavailableError(absl::StrCat("rank ", f->rank, " exited: ", f->exit.Describe()));
  }
  return absl::OkStatus();
}

absl::StatusOr<const RankCommunicators*> LocalRankGroup::Join(const std::atomic<bool>& cancel) {
  const int size = grid_.world();
  if (size == 1) return &communicators_;
  const auto deadline = Clock::now() + options_.ready_timeout;
  std::vector<bool> ready(size, false);
  ready[0] = true;
  for (;;) {
    if (const Follower* f = ReapExited()) {
      return absl::UnavailableError(
          absl::StrCat("rank ", f->rank, " exited before it was ready (", f->exit.Describe(), ")"));
    }
    std::vector<int> waiting;
    for (int rank = 1; rank < size; ++rank) {
      // A zero timeout only looks: the loop's own pace polls the followers' lives as well.
      if (!ready[rank])
        ready[rank] = store_->Get(ReadyKey(rank), std::chrono::milliseconds(0)).ok();
      if (!ready[rank]) waiting.push_back(rank);
    }
    if (waiting.empty()) break;
    if (cancel.load()) return absl::CancelledError("stopped while the ranks were starting");
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank", waiting.size() > 1 ? "s " : " ", absl::StrJoin(waiting, ", "),
                       " not ready within ", options_.ready_timeout.count() / 1000, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSIGN_OR_RETURN(communicators_, JoinGroups(*store_, grid_, 0, options_.comm));
  return &communicators_;
}

absl::Status LocalRankGroup::Finish(std::chrono::milliseconds grace) {
  const auto deadline = Clock::now() + grace;
  std::vector<std::string> failed;
  for (Follower& f : followers_) {
    if (!f.reaped) {
      const auto left =
          std::max(std::chrono::milliseconds(0),
                   std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
      absl::StatusOr<std::optional<ExitStatus>> exit = WaitFor(f.pid, left);
      if (exit.ok() && exit->has_value()) {
        f.reaped = true;
        f.exit = **exit;
      }
    }
    if (!f.reaped) {
      failed.push_back(
          absl::StrCat("rank ", f.rank, " still ran after ", grace.count(), " ms and was killed"));
    } else if (!f.exit.success()) {
      failed.push_back(absl::StrCat("rank ", f.rank, " exited: ", f.exit.Describe()));
    }
  }
  KillAll();
  if (failed.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrJoin(failed, "; "));
}

absl::StatusOr<RankCommunicators> JoinLocalRankGroup(const std::string& store_dir, int rank,
                                                     const placement::RankGrid& grid,
                                                     const CpuCommOptions& options) {
  const std::string what =
      absl::StrCat("rank ", rank, " of ", grid.world(), " joining ", store_dir);
  if (rank < 1 || rank >= grid.world()) {
    return absl::InvalidArgumentError(what + ": a follower's rank is in [1, size)");
  }
  absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(store_dir);
  if (!store.ok()) return Annotate(store.status(), what);
  RETURN_IF_ERROR(Annotate((*store)->Set(ReadyKey(rank), "1"), what));
  absl::StatusOr<RankCommunicators> communicators = JoinGroups(**store, grid, rank, options);
  if (!communicators.ok()) return Annotate(communicators.status(), what);
  return communicators;
}

}  // namespace shardline::comm
