// What the HTTP layer asks of a generation engine: tokens in, tokens out, no I/O. The
// continuously batching engine of one process (batching_engine.h) implements it now; the sharded
// engine of a serving job will implement the same interface.
//
// The engine works in token ids only. Text (the prompt's encoding, decoding, stop strings) is the
// API layer's business: a batching scheduler should not need a tokenizer, and stop strings can
// only be matched on decoded text, which the layer that owns the tokenizer has anyway.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline::serving {

using RequestId = uint64_t;

struct GenerationRequest {
  std::vector<int32_t> prompt;  // not empty
  int32_t max_tokens = 16;      // >= 1
  float temperature = 1.0f;     // <= 0: greedy
  float top_p = 1.0f;           // in (0, 1]
  int32_t top_k = 0;            // 0: all tokens
  uint64_t seed = 0;
  // Sampling one of these ends the request with kStop; the token itself is not delivered (the
  // end-of-sequence tokens of the tokenizer go here).
  std::vector<int32_t> stop_token_ids;
};

enum class FinishReason { kStop, kLength };

// Called on the engine's thread: keep them short and never call back into the engine from them
// except Cancel. After on_finish nothing more is called for that request.
struct StreamCallbacks {
  std::function<void(int32_t token)> on_token;
  // ok with the reason, or the error that ended the request (Cancelled after Cancel).
  std::function<void(absl::Status status, FinishReason reason)> on_finish;
};

struct EngineStats {
  int64_t running = 0;           // requests being generated now
  int64_t waiting = 0;           // requests queued behind them
  int64_t tokens_generated = 0;  // since the engine started
  int64_t kv_blocks = 0;         // blocks in the KV cache (0: the engine has no block cache)
  int64_t kv_blocks_used = 0;    // held by running sequences, after the last step
  int64_t preemptions = 0;       // sequences whose cache was dropped, to be recomputed
};

// Thread-safe: every method may be called from any thread.
class CompletionEngine {
 public:
  virtual ~CompletionEngine() = default;

  // Queues `request`. Unavailable when the engine is not ready (loading, stopping),
  // ResourceExhausted when its queue is full, InvalidArgument for a request it cannot run
  // (naming the field). On success exactly one on_finish follows, maybe on another thread,
  // maybe before Submit returns.
  virtual absl::StatusOr<RequestId> Submit(GenerationRequest request,
                                           StreamCallbacks callbacks) = 0;
  // Ends the request soon with on_finish(Cancelled); a no-op for an unknown or finished id.
  virtual void Cancel(RequestId id) = 0;
  virtual bool Ready() const = 0;
  virtual EngineStats Stats() const = 0;
  // The most positions a request may use: prompt tokens + max_tokens.
  virtual int32_t max_context() const = 0;
};

}  // namespace shardline::serving
