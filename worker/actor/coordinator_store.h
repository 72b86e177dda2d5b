// A comm::Store served by the coordinator's key-value store, reached over the actor's RPC client.
// Not thread-safe (the client is not): the bootstrap calls it from one thread.
#pragma once

#include "protocol/rpc_client.h"
#include "worker/comm/store.h"

namespace shardline::actor {

class CoordinatorStore final : public comm::Store {
 public:
  explicit CoordinatorStore(protocol::RpcClient& client) : client_(client) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  protocol::RpcClient& client_;
};

}  // namespace shardline::actor
