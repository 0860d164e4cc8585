// SPDX-License-Identifier: Apache-2.0
#pragma once
// All open streams of one daemon incarnation: validates requests, creates each stream's ring
// within the memory budget, routes NextBatch/Release/Close, and closes the streams of clients
// that are gone.
//
// Clients: a client attaches a *session* (the Attach call, held open for the client's life) and
// opens streams in it. When the session ends (the client exited, was killed, or closed it), its
// streams are closed at once. Streams of a live session are never closed for idleness; streams
// opened without a session (a client that could not attach in time) are closed after
// server.stream_idle_timeout_ms without a request. Sessions are bounded (2 x max_streams): each
// holds a server thread.
//
// Opens a client gave up on: an open stops before making the ring, and is not admitted, once its
// call is cancelled (the client's deadline passed, or it went away). For the moment between the
// last check and the answer reaching the client, the client names each open (open_id) and sends
// CloseStream(open_id) when it stops waiting: that closes the stream the open made, or makes the
// open drop it if it is still running or has not arrived yet. A lost open never holds a ring
// until the idle timeout.
//
// Authority: OpenStream returns a random 128-bit stream token; every later call on the stream
// must carry it (PERMISSION_DENIED otherwise, also for clients older than the token), so no other
// local process can take its batches.
//
// Plain C++ with its own tests; LoaderService only adapts gRPC to it. Every error names the field
// or the stream: INVALID_ARGUMENT for a bad field, NOT_FOUND for an unknown dataset or stream,
// FAILED_PRECONDITION for a handle or stream of another incarnation, RESOURCE_EXHAUSTED for a
// limit.
//
// Thread-safety: thread-safe.

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "proto/ringloader.pb.h"
#include "server/daemon/config.h"
#include "server/daemon/daemon_stats.h"
#include "server/daemon/dataset_registry.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/progress_watch.h"
#include "server/daemon/quarantine.h"
#include "server/daemon/sample_cache.h"
#include "server/daemon/status_history.h"
#include "server/daemon/stream.h"

namespace ringloader::server {

class FeederPool;

class TlsServer;

struct StreamManagerDeps {
  const DaemonConfig* config;  // server settings; datasets come from `datasets`
  const DatasetRegistry* datasets;
  pipeline::BatchFiller* filler;
  pipeline::SampleObserver* observer;
  DaemonStats* stats;
  MemoryBudget* budget;
  Quarantine* quarantine;
  const Failpoints* failpoints;
  uint64_t incarnation;
  std::chrono::steady_clock::time_point started;
  const pipeline::WorkerPool* pool = nullptr;  // for stats; may be null
  MemorySampleCache* cache = nullptr;           // eval cache; null = none
  const ProgressWatch* progress = nullptr;      // read-wait and decode times; may be null
  pipeline::FileBudget* read_files = nullptr;   // files reads ahead may hold; null = no limit
  uint64_t read_window = 0;                     // each stream's reads ahead; 0 = io_depth
  uint64_t read_stream_files = 0;               // files one stream's reads may hold; 0 = any
  const TlsServer* tls = nullptr;               // [tls], for stats; null = no TLS
  FeederPool* feeders = nullptr;                // [[feeders]]; null = none
};

// The transform a stream's spec asks for.
image::TransformSpec ToTransform(const v1::StreamSpec& spec);

// A stream spec checked against the server's limits: InvalidArgument naming the field and rule.
absl::Status ValidateStreamSpec(const ServerConfig& server, const v1::StreamSpec& spec);

// Which client a gRPC peer string belongs to, for server.max_streams_per_client: the TCP host
// ("ipv4:10.0.0.5:41234" -> "ipv4:10.0.0.5", "ipv6:[::1]:5000" -> "ipv6:[::1]"). Empty for Unix
// socket peers (gRPC 1.51 reports every one of them alike) and anything else: not counted.
std::string ClientKeyOfPeer(const std::string& peer);

class StreamManager {
 public:
  explicit StreamManager(StreamManagerDeps deps);
  ~StreamManager();  // Shutdown()

  // OpenStreamRequest.open_id's size.
  static constexpr size_t kOpenIdBytes = 16;

  // `peer` is the caller's gRPC peer string (ServerContext::peer()); see ClientKeyOfPeer.
  // `cancelled`: true once the caller stopped waiting (CANCELLED is returned, nothing is kept).
  absl::Status Open(const v1::OpenStreamRequest& request, v1::OpenStreamResponse* response,
                    const std::string& peer = "", const std::function<bool()>& cancelled = {});
  // `cancelled`: see Stream::Next.
  absl::Status Next(const v1::NextBatchRequest& request, v1::NextBatchResponse* response,
                    const std::function<bool()>& cancelled = {});
  absl::Status Release(const v1::ReleaseBatchesRequest& request);
  absl::Status Close(const v1::CloseStreamRequest& request);
  void Stats(v1::GetStatsResponse* response);
  // Of those, only streams_open and streams (cheap: no heap walk, no dataset stats).
  void StreamsStats(v1::GetStatsResponse* response);
  // The last 15 minutes of each stream's images/s and input-bound (the status page's plots).
  const StatusHistory& history() const { return history_; }
  void ListQuarantine(v1::ListQuarantineResponse* response);
  absl::Status ClearQuarantine(const v1::ClearQuarantineRequest& request,
                               v1::ClearQuarantineResponse* response);

  // Sessions (see the top of this file). OpenSession returns the new session's id (16 random
  // bytes); CloseSession closes every stream opened in it. Unavailable while shutting down.
  absl::StatusOr<std::string> OpenSession(const std::string& client_name);
  void CloseSession(const std::string& session_id);
  // Blocks up to `timeout` or until Shutdown(); true while the manager is not shut down.
  bool WaitUnlessShutDown(std::chrono::milliseconds timeout);
  size_t open_sessions() const;

  // Start-up: the daemon listens before its datasets are indexed. From SetStarting() until
  // MarkReady(), Open() answers UNAVAILABLE "ringloaderd is starting: <progress>" (clients retry
  // within their reconnect deadline) and Stats() says starting, with the progress.
  void SetStarting(std::string progress);
  void MarkReady();
  bool starting() const;
  std::string starting_progress() const;  // the latest progress line; empty once ready

  // Starts the background loop that reaps idle streams and samples rates.
  void StartReaper();
  // Stops the reaper and every stream; unlinks their segments. Idempotent.
  void Shutdown();
  size_t open_streams() const;
  // The open stream `id`, or null (tests force interleavings through its schedule()).
  std::shared_ptr<const Stream> FindStream(uint64_t id) const;

 private:
  absl::StatusOr<std::shared_ptr<Stream>> Find(uint64_t stream_id, uint64_t incarnation,
                                               const std::string& token);
  absl::Status Validate(const v1::StreamSpec& spec) const;
  void ReaperLoop();
  absl::Status Reject(absl::Status status);
  // The last step of Open: `stream` (started) joins streams_ unless its client has gone, gave
  // up on it or the manager shut down meanwhile; then it is stopped and let go (this holds the
  // last reference, so its memory is back before the opens waiting for room are woken).
  absl::Status Admit(std::shared_ptr<Stream> stream, const std::string& client_key,
                     const std::function<bool()>& cancelled);
  // An open of `client_key` no longer counts in opening_; wakes the opens waiting for room.
  void LeaveOpening(const std::string& client_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CloseStream(open_id).
  absl::Status CloseOpen(const std::string& open_id);
  // True (and forgotten) if the client gave up on `open_id` before its stream existed.
  bool TakeLostOpen(const std::string& open_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberLostOpen(const std::string& open_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts and logs an open dropped because its client gave up; CANCELLED.
  absl::Status GaveUp(const std::string& open_id);
  // Waits until max_streams (and the client's share) has room, shutdown, or `give_up`; returns
  // streams_left_ as it was then.
  uint64_t WaitForRoom(const std::string& client_key, std::chrono::steady_clock::time_point give_up);
  // Waits for a stream to leave after `left_before` was read; false at `give_up` or shutdown.
  bool WaitForStreamToLeave(uint64_t left_before, std::chrono::steady_clock::time_point give_up);
  // Stops `gone` (already out of streams_), lets their rings' reservations go, then wakes the
  // opens waiting for room. Empties `gone`.
  void StreamsLeft(std::vector<std::shared_ptr<Stream>>& gone);

  const StreamManagerDeps deps_;
  std::thread reaper_;
  StatusHistory history_;  // recorded by the reaper

  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;               // notified when stop_reaper_ is set
  bool stop_reaper_ ABSL_GUARDED_BY(reaper_mu_) = false;

  mutable std::mutex mu_;
  uint64_t next_stream_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  // Client keys of streams past the limit checks but not yet in streams_.
  std::multiset<std::string> opening_ ABSL_GUARDED_BY(mu_);
  // Live sessions: id -> client name.
  std::map<std::string, std::string> sessions_ ABSL_GUARDED_BY(mu_);
  // Open ids closed (CloseStream) before their stream existed, and when: the open drops it.
  std::map<std::string, std::chrono::steady_clock::time_point> lost_opens_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::condition_variable shut_down_cv_;  // notified (under mu_) when shut_down_ is set
  // Notified (under mu_) when an opening stream leaves opening_, when streams that left streams_
  // have been stopped and let go (StreamsLeft), and at shutdown: an Open waiting for room.
  std::condition_variable room_cv_;
  uint64_t streams_left_ ABSL_GUARDED_BY(mu_) = 0;  // streams stopped and let go, ever
  bool starting_ ABSL_GUARDED_BY(mu_) = false;
  std::string starting_progress_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringloader::server
