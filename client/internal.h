// SPDX-License-Identifier: Apache-2.0
#pragma once
// Internals shared by client.cc and stream.cc. Not installed; includes gRPC and shm.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "client/client.h"
#include "client/held_batches.h"
#include "proto/ringloader.grpc.pb.h"
#include "shm/ring.h"

namespace ringloader::client {

// What a Client and all its Streams share: the channel, the stub, the ring mappings and the
// session. Held by shared_ptr, so a Stream keeps working after its Client is destroyed.
//
// The session (proto Loader.Attach): a call held open by a background thread for as long as the
// Connection lives, so the daemon learns at once when this process is gone (exit, kill, crash)
// and closes its streams; while it is open, the daemon never closes our streams for idleness.
// The thread starts with the first SessionId() call and attaches again after a daemon restart.
// Thread-safety: thread-safe.
class Connection {
 public:
  // Throws Error(kInvalidArgument) for a malformed endpoint. Does not connect yet.
  explicit Connection(std::string endpoint);
  ~Connection();  // ends the session (cancels the call) and joins its thread
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // The live session's id, waiting up to `timeout` for one to be attached; empty if none is
  // (the daemon is down, or predates sessions): streams then fall back to the idle timeout.
  std::string SessionId(std::chrono::milliseconds timeout);
  // Forgets `session_id` (the daemon said it does not know it) so the next SessionId() waits
  // for a fresh one.
  void SessionRefused(const std::string& session_id);

  // Why nothing answers at the endpoint, for "no connection" errors: for a Unix socket, what a
  // connect() to it says ("permission denied: ... group G may connect", "no such file", ...).
  std::string DiagnoseNoConnection() const;

  // fork(): the child inherits this object but not its threads, and its gRPC connection is the
  // parent's. In the child it is inert: CheckNotForked() throws kFailedPrecondition saying to
  // open a new Client, and destruction sends nothing and frees nothing of gRPC's (a child that
  // touched them could break the parent's connection or hang in gRPC's destructors).
  bool InForkedChild() const { return ::getpid() != owner_pid_; }
  void CheckNotForked() const;

  const std::string& endpoint() const { return endpoint_; }
  v1::Loader::Stub& stub() { return *stub_; }
  // True when the channel has a live connection (does not try to connect).
  bool connected() { return channel_->GetState(false) == GRPC_CHANNEL_READY; }
  // Tries to connect until `deadline`; true once connected.
  bool WaitForConnected(std::chrono::system_clock::time_point deadline) {
    return channel_->WaitForConnected(deadline);
  }

  // Maps `segment` read-only, or returns the live mapping of the same (incarnation, segment).
  // Batches hold the returned pointer, so a mapping lives as long as any batch read from it.
  absl::StatusOr<std::shared_ptr<const shm::ConsumerRing>> MapSegment(const std::string& segment,
                                                                      uint64_t incarnation,
                                                                      const std::string& shm_dir);

 private:
  void SessionLoop();
  // True when an Attach call that ended with `status` lost its connection (the daemon died),
  // false when the daemon ended it and still listens (refused, shutting down).
  bool ConnectionDropped(const grpc::Status& status);
  // Returns once the channel is connected again (or stopping_), trying every few ms.
  void AwaitReconnect();

  const std::string endpoint_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Loader::Stub> stub_;
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  std::mutex mu_;
  std::map<std::pair<uint64_t, std::string>, std::weak_ptr<const shm::ConsumerRing>> mappings_
      ABSL_GUARDED_BY(mu_);

  std::mutex session_mu_;
  std::condition_variable session_cv_;  // notified when session_id_ or stopping_ changes
  // Started by the first SessionId(). A pointer so that a forked child can leave it alone.
  std::unique_ptr<std::thread> session_thread_ ABSL_GUARDED_BY(session_mu_);
  const pid_t owner_pid_ = ::getpid();
  grpc::ClientContext* session_context_ ABSL_GUARDED_BY(session_mu_) = nullptr;  // call in flight
  std::string session_id_ ABSL_GUARDED_BY(session_mu_);  // empty while no session is attached
  bool stopping_ ABSL_GUARDED_BY(session_mu_) = false;
};

struct Batch::Impl {
  ~Impl() {
    if (held) held->BatchDestroyed();
  }
  std::shared_ptr<HeldBatch> held;  // its slot (or its copy); null until delivered
  TensorView images, labels, indices;
  std::vector<TensorView> tensors;  // all of them, images/labels/indices included
  uint32_t size = 0;
  uint64_t sample_image_bytes = 0;
  uint64_t used_bytes = 0;  // of the slot: the end of the last tensor
  uint64_t incarnation = 0;
  Position position, next;
  bool last_in_epoch = false;
  std::vector<std::string> relative_paths;  // empty, or one per sample
};

// Checks a handle against the ring's geometry and the stream's options and builds the Batch's
// views into `payload` (the slot's mapping). Never trusts the wire: every offset, shape and byte
// count must agree and lie inside the slot. Internal naming the bad field otherwise.
// `decoded_images` false (an arrays dataset): a tensor named "images" is a plain column.
absl::StatusOr<std::unique_ptr<Batch::Impl>> MakeBatchImpl(const v1::BatchHandle& handle,
                                                           const StreamOptions& options,
                                                           bool decoded_images,
                                                           uint32_t slot_count,
                                                           std::span<const uint8_t> payload);

// Client::Open's body: validates, opens (retrying until options.reconnect_deadline), throws Error.
// `interrupted` (may be empty): see Client::Open.
std::unique_ptr<Stream> OpenStream(std::shared_ptr<Connection> connection,
                                   const StreamOptions& options,
                                   const std::function<bool()>& interrupted);

// The request's StreamSpec for `options`.
void FillSpec(const StreamOptions& options, v1::StreamSpec& spec);

// The daemon's counters (GetStats: what `ringloaderctl stats` shows). Throws Error: kUnavailable,
// with why, when nothing answers within `timeout`; kInvalidArgument for a malformed endpoint.
v1::GetStatsResponse FetchDaemonStats(const std::string& endpoint,
                                      std::chrono::milliseconds timeout);

}  // namespace ringloader::client
