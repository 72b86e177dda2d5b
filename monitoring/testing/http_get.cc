#include "monitoring/testing/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"

namespace shardline::monitoring::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Closes the socket on every return path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// Waits until `fd` is ready for `events`; false on timeout.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    const int rc = ::poll(&p, 1, RemainingMs(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the following call report the error
  }
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(const std::string& host_port, const std::string& path,
                                     std::chrono::milliseconds timeout) {
  const std::string where = "GET http://" + host_port + path;
  const Clock::time_point deadline = Clock::now() + timeout;
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(where + ": want HOST:PORT");
  }
  std::string host = host_port.substr(0, colon);
  sockaddr_storage address{};
  socklen_t address_len = 0;
  if (host.size() >= 2 && host.front() == '[') {
    host = host.substr(1, host.size() - 2);
    auto* sa = reinterpret_cast<sockaddr_in6*>(&address);
    sa->sin6_family = AF_INET6;
    sa->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.c_str(), &sa->sin6_addr) != 1) {
      return absl::InvalidArgumentError(where + ": bad IPv6 host");
    }
    address_len = sizeof(sockaddr_in6);
  } else {
    auto* sa = reinterpret_cast<sockaddr_in*>(&address);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, host.c_str(), &sa->sin_addr) != 1) {
      return absl::InvalidArgumentError(where + ": host must be a numeric address");
    }
    address_len = sizeof(sockaddr_in);
  }

  Fd sock{::socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  if (sock.fd < 0) return absl::InternalError(where + ": socket: " + std::strerror(errno));
  if (::connect(sock.fd, reinterpret_cast<sockaddr*>(&address), address_len) != 0) {
    if (errno != EINPROGRESS) {
      return absl::UnavailableError(where + ": connect: " + std::strerror(errno));
    }
    if (!WaitFor(sock.fd, POLLOUT, deadline)) {
      return absl::DeadlineExceededError(where + ": connect timed out");
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(sock.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return absl::UnavailableError(where + ": connect: " + std::strerror(err));
  }

  // HTTP/1.0 so that the server closes the connection after the body: no chunked decoding.
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: " + host_port + "\r\nConnection: close\r\n\r\n";
  size_t sent = 0;
  while (sent < request.size()) {
    if (!WaitFor(sock.fd, POLLOUT, deadline)) {
      return absl::DeadlineExceededError(where + ": send timed out");
    }
    const ssize_t n = ::send(sock.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(where + ": send: " + std::strerror(errno));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }

  std::string response;
  char buffer[16384];
  while (true) {
    if (!WaitFor(sock.fd, POLLIN, deadline)) {
      return absl::DeadlineExceededError(where + ": no complete response within " +
                                         std::to_string(timeout.count()) + " ms");
    }
    const ssize_t n = ::recv(sock.fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return absl::UnavailableError(where + ": recv: " + std::strerror(errno));
    }
    response.append(buffer, static_cast<size_t>(n));
  }

  const size_t header_end = response.find("\r\n\r\n");
  int status = 0;
  // "HTTP/1.1 200 OK": the code is the second word of the status line.
  const size_t space = response.find(' ');
  if (header_end == std::string::npos || space == std::string::npos || space > header_end ||
      !absl::SimpleAtoi(response.substr(space + 1, 3), &status)) {
    return absl::DataLossError(where + ": malformed HTTP response: " + response.substr(0, 80));
  }
  return HttpResponse{status, response.substr(header_end + 4)};
}

}  // namespace shardline::monitoring::testing
