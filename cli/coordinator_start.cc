#include "cli/coordinator_start.h"

#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/process.h"

namespace shardline::cli {

std::string ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string TailOfFile(const std::filesystem::path& path, size_t lines) {
  std::vector<std::string> all;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += "    " + all[i] + "\n";
  }
  return out;
}

absl::StatusOr<std::string> AwaitCoordinatorEndpoint(pid_t& pid,
                                                     const std::filesystem::path& endpoint_file,
                                                     std::chrono::seconds timeout,
                                                     const std::filesystem::path& log) {
  // The coordinator writes the file whole and renames it into place once it listens.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!std::filesystem::exists(endpoint_file)) {
    auto exited = TryReap(pid);
    if (exited.ok() && exited->has_value()) {
      pid = 0;
      return absl::InternalError("the coordinator exited (" + (*exited)->Describe() + ")" +
                                 (log.empty() ? "" : ":\n" + TailOfFile(log, 10)));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError("the coordinator did not listen within " +
                                         std::to_string(timeout.count()) + " s" +
                                         (log.empty() ? "" : "; see " + log.string()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ReadWholeFile(endpoint_file);
}

}  // namespace shardline::cli
