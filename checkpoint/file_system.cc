#include "checkpoint/file_system.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {
namespace {

namespace fs = std::filesystem;

absl::Status Errno(const std::string& path, std::string_view what) {
  return absl::InternalError(
      absl::StrCat("writing ", path, ": ", std::string(what), ": ", std::strerror(errno)));
}

std::string ParentOf(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// A rename or a new entry is durable only once its directory is.
absl::Status SyncDirectory(const std::string& directory, const std::string& for_path) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(for_path, absl::StrCat("open directory ", directory));
  const int synced = ::fsync(fd);
  ::close(fd);
  if (synced != 0) return Errno(for_path, "fsync directory");
  return absl::OkStatus();
}

class PosixAtomicFile final : public WritableFile {
 public:
  PosixAtomicFile(int fd, std::string path, std::string temp_path)
      : fd_(fd), path_(std::move(path)), temp_path_(std::move(temp_path)) {}
  ~PosixAtomicFile() override {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_path_.c_str());
  }

  absl::Status Append(std::span<const std::byte> data) override {
    while (!data.empty()) {
      const ssize_t written = ::write(fd_, data.data(), data.size());
      if (written < 0) {
        if (errno == EINTR) continue;
        return Errno(path_, "write");
      }
      data = data.subspan(static_cast<size_t>(written));
    }
    return absl::OkStatus();
  }

  absl::Status Commit() override {
    if (::fsync(fd_) != 0) return Errno(path_, "fsync");
    if (::close(std::exchange(fd_, -1)) != 0) return Errno(path_, "close");
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0) return Errno(path_, "rename");
    committed_ = true;
    return SyncDirectory(ParentOf(path_), path_);
  }

 private:
  int fd_;
  std::string path_;
  std::string temp_path_;
  bool committed_ = false;
};

class PosixFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAtomicFile(const std::string& path) override {
    // The pid keeps two processes writing the same path from sharing a temporary.
    const std::string temp_path = absl::StrCat(path, ".tmp.", ::getpid());
    const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Errno(path, absl::StrCat("open ", temp_path));
    return std::make_unique<PosixAtomicFile>(fd, path, temp_path);
  }

  absl::Status CreateDirectories(const std::string& path) override {
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", ec.message()));
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    std::error_code ec;
    if (fs::exists(to, ec)) {
      return absl::AlreadyExistsError(absl::StrCat("cannot rename ", from, " to ", to,
                                                   ": the target exists"));
    }
    if (::rename(from.c_str(), to.c_str()) != 0) return Errno(to, "rename from " + from);
    return SyncDirectory(ParentOf(to), to);
  }

  absl::Status RemoveAll(const std::string& path) override {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
    return absl::OkStatus();
  }
};

}  // namespace

FileSystem& DefaultFileSystem() {
  static PosixFileSystem* const file_system = new PosixFileSystem();
  return *file_system;
}

absl::Status WriteFileAtomically(FileSystem& fs, const std::string& path,
                                 std::span<const std::span<const std::byte>> parts) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.NewAtomicFile(path));
  for (std::span<const std::byte> part : parts) RETURN_IF_ERROR(file->Append(part));
  return file->Commit();
}

absl::Status WriteFileAtomically(FileSystem& fs, const std::string& path, std::string_view text) {
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span<const char>(text))};
  return WriteFileAtomically(fs, path, parts);
}

}  // namespace shardline::checkpoint
