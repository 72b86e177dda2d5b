#include "worker/comm/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/file_store.h>

namespace shardline::comm {
// gloo's FileStore names each key's file after a hash of the key, writes it once (a second set
// of the same key fails) and polls for it in wait. We keep its naming, wait and get, and add what
// a comm::Store needs beyond that: overwriting (write a temporary file, rename it over the old
// one, so that readers see the old or the new value, never a torn one) and an existence check.
class FileStore::Files final : public gloo::rendezvous::FileStore {
 public:
  using gloo::rendezvous::FileStore::FileStore;

  bool Has(const std::string& key) { return check({key}); }
  std::string PathOf(const std::string& key) { return objectPath(key); }

  // Empty on success, else what failed.
  std::string Write(const std::string& key, const std::string& value) {
    static std::atomic<uint64_t> sequence{0};
    const std::string path = objectPath(key);
    // Unique per writer, so that concurrent writers never share a temporary file.
    const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                            std::to_string(sequence.fetch_add(1));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return "creating '" + tmp + "': " + std::strerror(errno);
    size_t written = 0;
    while (written < value.size()) {
      const ssize_t n = ::write(fd, value.data() + written, value.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const std::string error = "writing '" + tmp + "': " + std::strerror(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        return error;
      }
      written += static_cast<size_t>(n);
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const std::string error = "renaming '" + tmp + "' to '" + path + "': " + std::strerror(errno);
      ::unlink(tmp.c_str());
      return error;
    }
    return "";
  }
};

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& directory) {
  struct stat st {};
  if (::stat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError("file store directory '" + directory +
                                      "' does not exist or is not a directory");
  }
  try {
    auto files = std::make_unique<Files>(directory);
    return std::unique_ptr<FileStore>(new FileStore(directory, std::move(files)));
  } catch (const std::exception& e) {
    return absl::InternalError("opening file store in '" + directory + "': " + e.what());
  }
}

FileStore::FileStore(std::string directory, std::unique_ptr<Files> files)
    : directory_(std::move(directory)), files_(std::move(files)) {}

FileStore::~FileStore() = default;

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  const std::string error = files_->Write(key, value);
  if (error.empty()) return absl::OkStatus();
  return absl::UnavailableError("file store '" + directory_ + "': setting key '" + key +
                                "': " + error);
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key,
                                           std::chrono::milliseconds timeout) {
  // Our own poll rather than gloo's FileStore::wait, which overshoots a short timeout by up to a
  // second.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool present = false;
    try {
      present = files_->Has(key);
    } catch (const std::exception& e) {
      return absl::UnavailableError("file store '" + directory_ + "': waiting for key '" + key +
                                    "': " + e.what());
    }
    if (present) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError("file store '" + directory_ + "': key '" + key +
                                         "' was not set within " +
                                         std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  try {
    std::vector<char> data = files_->get(key);
    return std::string(data.begin(), data.end());
  } catch (const std::exception& e) {
    return absl::UnavailableError("file store '" + directory_ + "': reading key '" + key +
                                  "': " + e.what());
  }
}

absl::StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  const std::string lock_path = files_->PathOf(key) + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError("file store '" + directory_ + "': opening lock '" + lock_path +
                                  "': " + std::strerror(errno));
  }
  // The lock file serialises read-modify-write across processes; closing it releases the lock.
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  if (::flock(fd, LOCK_EX) != 0) {
    return absl::UnavailableError("file store '" + directory_ + "': locking '" + lock_path +
                                  "': " + std::strerror(errno));
  }
  int64_t current = 0;
  try {
    if (files_->Has(key)) {
      std::vector<char> data = files_->get(key);
      const std::string text(data.begin(), data.end());
      size_t used = 0;
      current = std::stoll(text, &used);
      if (used != text.size()) throw std::invalid_argument("trailing characters");
    }
  } catch (const std::exception&) {
    return absl::FailedPreconditionError("file store '" + directory_ + "': key '" + key +
                                         "' does not hold an integer, so Add cannot update it");
  }
  const int64_t result = current + delta;
  absl::Status set = Set(key, std::to_string(result));
  if (!set.ok()) return set;
  return result;
}

}  // namespace shardline::comm
