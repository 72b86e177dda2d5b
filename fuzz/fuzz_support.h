// What the harnesses share: a file holding the input, for loaders that only take a path, and the
// check that ends a run when a parser breaks a promise its header makes (libFuzzer and the replay
// test both report an abort as a failure, with the input that caused it).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace shardline::fuzz {

// An anonymous in-memory file (memfd) holding `bytes`, named by its /proc/self/fd path: no disk
// I/O per execution, and nothing left behind when a run is killed.
class MemoryFile {
 public:
  explicit MemoryFile(std::string_view bytes) {
    fd_ = ::memfd_create("shardline-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) Die("memfd_create failed");
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n <= 0) Die("writing the memfd failed");
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] static void Die(const char* what) {
    std::perror(what);
    std::abort();
  }

  int fd_ = -1;
  std::string path_;
};

[[noreturn]] inline void BrokenPromise(const char* file, int line, const char* condition,
                                       const std::string& detail) {
  std::fprintf(stderr, "%s:%d: broken promise: %s\n%s\n", file, line, condition, detail.c_str());
  std::abort();
}

}  // namespace shardline::fuzz

// Aborts, naming the condition and `detail` (a std::string), when `condition` is false.
#define FUZZ_CHECK(condition, detail)                                                  \
  do {                                                                                 \
    if (!(condition)) ::shardline::fuzz::BrokenPromise(__FILE__, __LINE__, #condition, \
                                                       (detail));                      \
  } while (0)
