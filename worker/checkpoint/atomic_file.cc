#include "worker/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace shardline::checkpoint {
namespace {

absl::Status Errno(const std::string& path, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("writing ", path, ": ", what, ": ", std::strerror(errno)));
}

bool WriteAll(int fd, std::span<const std::byte> data) {
  while (!data.empty()) {
    const ssize_t written = ::write(fd, data.data(), data.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data = data.subspan(static_cast<size_t>(written));
  }
  return true;
}

// Closes the descriptor and removes the temporary file unless released.
class TempFile {
 public:
  TempFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  bool Close() { return ::close(std::exchange(fd_, -1)) == 0; }
  void Release() { path_.clear(); }

 private:
  int fd_;
  std::string path_;
};

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 std::span<const std::span<const std::byte>> parts) {
  // The pid keeps two processes writing the same path from sharing a temporary.
  const std::string temp_path = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(path, absl::StrCat("open ", temp_path));
  TempFile temp(fd, temp_path);
  for (std::span<const std::byte> part : parts) {
    if (!WriteAll(fd, part)) return Errno(path, "write");
  }
  if (::fsync(fd) != 0) return Errno(path, "fsync");
  if (!temp.Close()) return Errno(path, "close");
  if (::rename(temp_path.c_str(), path.c_str()) != 0) return Errno(path, "rename");
  temp.Release();
  // The rename is durable only once the directory entry is.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string directory = parent.empty() ? std::string(".") : parent.string();
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Errno(path, absl::StrCat("open directory ", directory));
  const int synced = ::fsync(dir_fd);
  ::close(dir_fd);
  if (synced != 0) return Errno(path, "fsync directory");
  return absl::OkStatus();
}

}  // namespace shardline::checkpoint
