// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which gRPC failures the client survives, and how long it waits between attempts.
// Internal to ringloader_client (includes gRPC); tests include it directly.

#include <chrono>
#include <cstdint>
#include <random>
#include <string>

#include "absl/strings/string_view.h"
#include "client/client.h"
#include "grpcpp/support/status.h"

namespace ringloader::client {

// The RPC that failed. The same code means different things for an OpenStream (the request names
// a dataset) and for a call on an open stream (the request names only the stream id, the
// incarnation and this stream's own releases).
enum class RpcKind { kOpenStream, kStreamCall };

enum class Recovery {
  kFail,    // a real error: throw Error(ToErrorCode(code), daemon's message)
  kReopen,  // back off, reconnect and reopen the stream at the client's own position
};

// THE retry policy (the only place that decides it; tf.data service style).
//
// Reopened, for every RPC:
//   UNAVAILABLE        no daemon listening, connection refused/reset, daemon shutting down.
//   CANCELLED          the call was torn down with the connection (daemon died mid-call).
//   DEADLINE_EXCEEDED  the daemon hung past wait_ms + margin; we cannot know whether it leased a
//                      batch for us, so the old stream is abandoned and reopened at our position.
//   ABORTED            a concurrency conflict; retrying is the documented remedy.
//   UNKNOWN            gRPC reports some transport failures so ("Stream removed"); ringloaderd
//                      never returns UNKNOWN itself.
//   INTERNAL           only gRPC's transport form "Received RST_STREAM ..." (a daemon killed
//                      mid-response); any other INTERNAL is a real error.
// Reopened for calls on an open stream only (NextBatch, ReleaseBatches):
//   NOT_FOUND, FAILED_PRECONDITION  the stream id or incarnation is stale: the daemon restarted
//                      or reclaimed the stream. (For OpenStream, NOT_FOUND is an unknown dataset.)
// Everything else (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, DATA_LOSS, PERMISSION_DENIED, ...) fails
// at once: retrying cannot change the answer. Every retry is bounded by
// StreamOptions::reconnect_deadline.
Recovery Classify(grpc::StatusCode code, absl::string_view message, RpcKind kind);

// The Error code a failed call maps to when it is not retried (or retries ran out).
ErrorCode ToErrorCode(grpc::StatusCode code);

// "UNAVAILABLE: failed to connect to all addresses" -- for error messages.
std::string DescribeStatus(const grpc::Status& status);

// Capped exponential backoff with jitter: attempt k waits min(cap, initial * 2^k) scaled by a
// uniform factor in [0.5, 1.0]. Deterministic for a given seed (tests pass one).
class Backoff {
 public:
  static constexpr std::chrono::microseconds kInitial{5'000};
  static constexpr std::chrono::microseconds kCap{250'000};

  explicit Backoff(uint64_t seed, std::chrono::microseconds initial = kInitial,
                   std::chrono::microseconds cap = kCap);
  std::chrono::microseconds NextDelay();
  void Reset() { attempt_ = 0; }

 private:
  std::mt19937_64 rng_;
  std::chrono::microseconds initial_;
  std::chrono::microseconds cap_;
  uint32_t attempt_ = 0;
};

}  // namespace ringloader::client
