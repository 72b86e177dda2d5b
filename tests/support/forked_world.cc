#include "tests/support/forked_world.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "kernels/backend.h"
#include "worker/comm/communicator.h"
#include "worker/comm/cpu_communicator.h"
#include "worker/comm/file_store.h"
#include "worker/comm/store.h"

namespace shardline::testing {
namespace {

using Clock = std::chrono::steady_clock;

int RunRank(const placement::RankGrid& grid, const std::string& store_dir, int rank,
            const RankBody& body, ForkedBackend backend) {
  auto files = comm::FileStore::Open(store_dir);
  if (!files.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(files.status().message()).c_str());
    return 100;
  }
  comm::CpuCommOptions options;
  options.gloo.timeout = std::chrono::seconds(60);
  options.shm.timeout = std::chrono::seconds(60);
  std::vector<std::unique_ptr<comm::Communicator>> owned;
  model::ShardedGroups groups;
  // Every rank joins its groups in the same order (world, tp, pp, dp), so no two ranks wait on
  // each other's later group.
  for (const placement::CommGroup& group : grid.GroupsOf(rank)) {
    if (group.ranks.size() == 1) continue;
    const int index = static_cast<int>(
        std::find(group.ranks.begin(), group.ranks.end(), rank) - group.ranks.begin());
    comm::PrefixStore store(group.id, **files);
    const int size = static_cast<int>(group.ranks.size());
    auto communicator = backend == ForkedBackend::kGloo
                            ? comm::CreateGlooCommunicator(store, index, size, options.gloo)
                            : comm::CreateCpuCommunicator(store, index, size, options);
    if (!communicator.ok()) {
      std::fprintf(stderr, "rank %d group %s: %s\n", rank, group.id.c_str(),
                   std::string(communicator.status().message()).c_str());
      return 101;
    }
    comm::Communicator* raw = communicator->get();
    owned.push_back(std::move(*communicator));
    if (group.kind == "world") groups.world = raw;
    if (group.kind == "tp") groups.tp = raw;
    if (group.kind == "pp") groups.pp = raw;
    if (group.kind == "dp") groups.dp = raw;
  }
  return body(rank, grid.Coords(rank), groups);
}

}  // namespace

bool ForkedWorldResult::ok() const {
  return std::all_of(exit_codes.begin(), exit_codes.end(), [](int code) { return code == 0; });
}

std::string ForkedWorldResult::Describe() const {
  std::string out;
  for (size_t rank = 0; rank < exit_codes.size(); ++rank) {
    if (exit_codes[rank] == 0) continue;
    if (!out.empty()) out += "; ";
    out += "rank " + std::to_string(rank) +
           (exit_codes[rank] < 0 ? std::string(" was killed")
                                 : " exited with " + std::to_string(exit_codes[rank]));
  }
  return out.empty() ? "every rank exited with 0" : out;
}

ForkedWorldResult RunForkedWorld(const placement::RankGrid& grid, const std::string& store_dir,
                                 const RankBody& body, std::chrono::seconds deadline,
                                 ForkedBackend backend) {
  std::vector<pid_t> children;
  ForkedWorldResult result;
  result.exit_codes.assign(grid.world(), -1);
  // Buffered output would otherwise be copied into every child and printed once per rank.
  std::fflush(nullptr);
  for (int rank = 0; rank < grid.world(); ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int code = RunRank(grid, store_dir, rank, body, backend);
      std::fflush(nullptr);
      _exit(code);  // never back into the caller (gtest)
    }
    children.push_back(pid);
  }
  const auto until = Clock::now() + deadline;
  for (int rank = 0; rank < grid.world(); ++rank) {
    if (children[rank] < 0) continue;
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(children[rank], &status, WNOHANG)) == 0 && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (done == 0) {
      for (pid_t pid : children) {
        if (pid > 0) kill(pid, SIGKILL);
      }
      waitpid(children[rank], &status, 0);
      continue;
    }
    if (WIFEXITED(status)) result.exit_codes[rank] = WEXITSTATUS(status);
  }
  return result;
}

std::string MakeTempDir(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

std::string GpuUnavailableFromAChild() {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    auto gpu = kernels::CreateBackend(kernels::BackendOptions{.device = kernels::Device::kCuda});
    const std::string reason = gpu.ok() ? "" : std::string(gpu.status().message());
    const ssize_t written = write(fds[1], reason.data(), reason.size());
    _exit(written == static_cast<ssize_t>(reason.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string reason;
  char buffer[256];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof(buffer))) > 0;) reason.append(buffer, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return reason;
}

}  // namespace shardline::testing
