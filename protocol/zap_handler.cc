#include "protocol/zap_handler.h"

#include <atomic>
#include <future>
#include <map>
#include <set>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "absl/synchronization/mutex.h"
#include "protocol/channel.h"
#include "spdlog/spdlog.h"

namespace shardline::protocol {
namespace {

// Unknown keys are logged once each up to this many; past it they are only counted, so that a
// flood of random keys grows neither the log nor this set.
constexpr size_t kMaxLoggedKeys = 256;

std::string Z85(const zmq::message_t& raw_key) {
  if (raw_key.size() != 32) return {};
  char text[41];
  if (zmq_z85_encode(text, static_cast<const uint8_t*>(raw_key.data()), 32) == nullptr) return {};
  return text;
}

class ZapHandler {
 public:
  static ZapHandler& Get() {
    static ZapHandler* handler = new ZapHandler();  // leaked, as the context it serves
    return *handler;
  }

  std::string Register(std::shared_ptr<const Allowlist> allowlist, AuthObserver* observer) {
    const std::string domain = "shardline-" + std::to_string(next_domain_.fetch_add(1));
    absl::MutexLock lock(&mutex_);
    domains_[domain] = Domain{std::move(allowlist), observer};
    return domain;
  }

  void Unregister(const std::string& domain) {
    absl::MutexLock lock(&mutex_);
    domains_.erase(domain);
  }

 private:
  struct Domain {
    std::shared_ptr<const Allowlist> allowlist;
    AuthObserver* observer = nullptr;
  };

  ZapHandler() {
    std::promise<void> bound;
    auto ready = bound.get_future();
    std::thread([this, bound = std::move(bound)]() mutable { Serve(bound); }).detach();
    ready.wait();
  }

  void Serve(std::promise<void>& bound) {
    zmq::socket_t socket(ZmqContext(), zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind("inproc://zeromq.zap.01");
    bound.set_value();
    while (true) {
      std::vector<zmq::message_t> request;
      try {
        zmq::message_t part;
        do {
          if (!socket.recv(part)) break;
          request.push_back(std::move(part));
          part = zmq::message_t();
        } while (request.back().more());
        Reply(socket, request);
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        spdlog::error("ZAP handler: {}", e.what());
      }
    }
  }

  // Request: version, request id, domain, address, routing id, mechanism, credentials.
  // Reply: version, request id, status code, status text, user id, metadata.
  void Reply(zmq::socket_t& socket, const std::vector<zmq::message_t>& request) {
    std::string code = "400", text = "malformed ZAP request", user_id;
    const std::string request_id = request.size() > 1 ? request[1].to_string() : std::string();
    if (request.size() >= 7 && request[0].to_string() == "1.0") {
      const std::string domain = request[2].to_string();
      const std::string address = request[3].to_string();
      const std::string mechanism = request[5].to_string();
      // Decided under the lock, observer calls included: a server unregistering meanwhile
      // (its observer about to be destroyed) waits for this request to finish.
      absl::MutexLock lock(&mutex_);
      auto it = domains_.find(domain);
      AuthObserver* observer = it == domains_.end() ? nullptr : it->second.observer;
      auto refuse = [&](std::string_view reason, std::string why) {
        text = std::move(why);
        if (observer) observer->OnAuthRefused(reason);
      };
      if (it == domains_.end()) {
        text = "no server of this process serves ZAP domain '" + domain + "'";
      } else if (mechanism != "CURVE") {
        refuse("no_curve", "only CURVE is accepted");
      } else if (const std::string key = Z85(request[6]); key.empty()) {
        refuse("handshake", "malformed CURVE key");
      } else if (it->second.allowlist->Find(key)) {
        code = "200";
        text = "OK";
        user_id = key;
      } else {
        refuse("unknown_key", "key not on the allowlist");
        LogUnknownKey(key, address, it->second.allowlist->file().string());
      }
    }
    const std::string frames[] = {"1.0", request_id, code, text, user_id, ""};
    for (size_t i = 0; i < 6; ++i) {
      socket.send(zmq::buffer(frames[i]), i < 5 ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

  void LogUnknownKey(const std::string& key, const std::string& address,
                     const std::string& allowlist) {
    // Only this thread touches logged_keys_.
    if (logged_keys_.size() >= kMaxLoggedKeys) return;
    if (!logged_keys_.insert(key).second) return;
    spdlog::warn("refused a CURVE connection from {}: key {} is not on the allowlist {}{}", address,
                 key, allowlist,
                 logged_keys_.size() == kMaxLoggedKeys
                     ? " (further unknown keys are counted in shardline_auth_refusals_total, "
                       "not logged)"
                     : "");
  }

  std::atomic<uint64_t> next_domain_{1};
  absl::Mutex mutex_;
  std::map<std::string, Domain> domains_ ABSL_GUARDED_BY(mutex_);
  std::set<std::string> logged_keys_;
};

}  // namespace

std::string RegisterZapDomain(std::shared_ptr<const Allowlist> allowlist, AuthObserver* observer) {
  return ZapHandler::Get().Register(std::move(allowlist), observer);
}

void UnregisterZapDomain(const std::string& domain) { ZapHandler::Get().Unregister(domain); }

}  // namespace shardline::protocol
