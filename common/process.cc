#include "common/process.h"

#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "absl/status/status.h"

namespace shardline {
namespace {

ExitStatus FromWaitStatus(int status) {
  ExitStatus out;
  if (WIFSIGNALED(status)) {
    out.signaled = true;
    out.code = WTERMSIG(status);
  } else {
    out.code = WEXITSTATUS(status);
  }
  return out;
}

}  // namespace

std::string ExitStatus::Describe() const {
  if (signaled) {
    // "killed by SIGKILL (signal 9)": the name people type in `kill -9` and look for in logs.
    const char* abbreviation = sigabbrev_np(code);
    return abbreviation != nullptr
               ? "killed by SIG" + std::string(abbreviation) + " (signal " + std::to_string(code) + ")"
               : "killed by signal " + std::to_string(code) + " (" + strsignal(code) + ")";
  }
  return "exit code " + std::to_string(code);
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

absl::StatusOr<pid_t> Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("spawn: empty argv");
  // Everything the child needs is prepared before fork: only async-signal-safe calls after it.
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  // extra_env replaces a variable of the same name (getenv would find the first of two).
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : options.extra_env) replaced = replaced || k == name;
    if (!replaced) env_strings.emplace_back(entry);
  }
  for (const auto& [k, v] : options.extra_env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  int log_fd = -1;
  if (!options.log_path.empty()) {
    log_fd = ::open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::InternalError("spawn: cannot open log file " + options.log_path + ": " +
                                 strerror(errno));
    }
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    if (log_fd >= 0) ::close(log_fd);
    return absl::InternalError(std::string("spawn: fork failed: ") + strerror(errno));
  }
  if (pid == 0) {
    if (options.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    }
    if (log_fd >= 0) {
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
    }
    // Signals the parent ignores or blocks must not leak into the child.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  return pid;
}

absl::StatusOr<std::optional<ExitStatus>> TryReap(pid_t pid) {
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == 0) return std::optional<ExitStatus>();
  if (r < 0) {
    return absl::InternalError("waitpid(" + std::to_string(pid) + "): " + strerror(errno));
  }
  return std::optional<ExitStatus>(FromWaitStatus(status));
}

absl::StatusOr<std::optional<ExitStatus>> WaitFor(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto reaped = TryReap(pid);
    if (!reaped.ok() || reaped->has_value()) return reaped;
    if (std::chrono::steady_clock::now() >= deadline) return reaped;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

ExitStatus Terminate(pid_t pid, std::chrono::milliseconds grace) {
  ::kill(pid, SIGTERM);
  auto reaped = WaitFor(pid, grace);
  if (reaped.ok() && reaped->has_value()) return **reaped;
  ::kill(pid, SIGKILL);
  reaped = WaitFor(pid, std::chrono::seconds(10));
  if (reaped.ok() && reaped->has_value()) return **reaped;
  return ExitStatus{true, SIGKILL};
}

std::string SelfExecutable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "shardline";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace shardline
