// SPDX-License-Identifier: Apache-2.0
#pragma once
// The host's side of feeders ([[feeders]]): the connections to the daemons that decode for this
// host, which of them takes which samples, and what each has done.
//
// Each stream leases part of each round of its batches (pipeline::RemoteDecode) through a
// FeederPool::ForStream view. The pool splits the samples between the feeders that are up, in
// proportion to how fast each has delivered, and against this host's own decode threads (their
// measured rate) unless server.local_decode = false. Each call runs on a thread of its own, keeping
// the slices its answer came in under a reservation of memory_limit (at once or not at all), and is
// checked (size, checksum) before the filler copies anything out of it. A feeder that fails a call,
// or does not answer within server.feeder_lease_ms, is given no more for a pause that doubles with
// each failure in a row (1 s to 30 s); one that refuses a dataset (a different fingerprint or
// decode limits: its files or rules are not this host's) is given none of that dataset's samples
// for 10 minutes, and says why in stats. A name with several addresses is each of them, resolved
// again every 30 s; an address gone from it for 5 minutes is forgotten.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "openssl/ssl.h"
#include "proto/ringloader.grpc.pb.h"
#include "server/daemon/config.h"
#include "server/daemon/memory_budget.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/remote_decode.h"

namespace ringloader::server {

class FeederPool {
 public:
  // Reads [tls]'s files (the host's certificate is its client certificate to feeders) and starts
  // resolving the feeders' addresses. Errors name the [tls] key and file.
  static absl::StatusOr<std::unique_ptr<FeederPool>> Start(const DaemonConfig& config,
                                                           MemoryBudget& budget);
  // SIGHUP: reads [tls]'s files again (the rotation of this host's client certificate) and dials
  // every feeder anew with them; calls in flight finish on their old channels. An error names
  // the key and file, and the running certificate stays. Nothing to do without [tls].
  absl::Status ReloadTls(const TlsConfig& tls);
  ~FeederPool();  // cancels the calls in flight and waits for their threads

  // A stream's view: leases for its dataset (served as `dataset_name`), spec and decode limits.
  // The pool outlives the view.
  std::unique_ptr<pipeline::RemoteDecode> ForStream(const std::string& dataset_name,
                                                    const pipeline::Dataset& dataset,
                                                    const v1::StreamSpec& spec,
                                                    const image::DecodeLimits& limits);

  // For GetStats and /metrics.
  std::vector<v1::FeederStatus> Status() const;
  uint64_t fallback_samples() const { return fallback_samples_.load(); }
  // Good samples decoded here for rounds to come while the feeders' answers were late.
  uint64_t ahead_samples() const { return ahead_samples_.load(); }
  uint64_t local_rate() const;

 private:
  struct Feeder;
  struct CallState;
  struct PooledSocket;
  struct Received;
  class Call;
  class StreamView;
  // How feeders are dialled: gRPC's credentials, and the data plane's TLS context (feed_socket.h;
  // null without [tls]).
  struct Dialling {
    std::shared_ptr<grpc::ChannelCredentials> grpc;
    std::shared_ptr<SSL_CTX> data;
  };
  FeederPool(const DaemonConfig& config, MemoryBudget& budget, Dialling credentials);
  // The samples of a round of `k` to lease: the dataset's fraction plus a stream's `adjust`.
  uint64_t ShareFor(const std::string& dataset, uint64_t k, double adjust);
  // The rate assumed of a feeder not measured yet: the measured ones' mean, else this host's.
  double Unmeasured() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::unique_ptr<pipeline::RemoteCall>> StartFor(const StreamView& view,
                                                              uint64_t epoch,
                                                              std::span<const uint64_t> indices);
  void LocalDone(uint64_t samples, std::chrono::nanoseconds elapsed);
  // A round's lead, less the one aimed at (in rounds), from `stream`'s round: moves the
  // dataset's fraction, by the same amount per round of all its steering streams together,
  // however many they are. Those that do not steer (an idle validation stream, a paused
  // trainer) do not count: a stream counts while it steered (or came) within twice its own pace
  // (the dataset's steers between its last two), or the streams' count if that is more.
  void Steer(const std::string& dataset, const void* stream, double lead_error);
  // `stream` of `dataset` came, or went.
  void AddStream(const std::string& dataset, const void* stream);
  void RemoveStream(const std::string& dataset, const void* stream);
  static absl::StatusOr<Dialling> Credentials(const TlsConfig& tls);
  // A feeder's channel, and service Feeder's method on it (called raw: feed_frames.h).
  struct FeedChannel {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<grpc::internal::RpcMethod> method;
  };
  std::shared_ptr<FeedChannel> MakeStub(const Feeder& feeder) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResolveLoop();
  // Each [[feeders]] address's IPs, dialled from now on; `numeric_only`: only those that need
  // no DNS (at start, which must not wait on a resolver).
  void Resolve(bool numeric_only);
  // A call's thread: the RPC, its checks, and what it says of the feeder. Over the feeder's
  // data plane when it has one (feed_socket.h) and it can be dialled, else over gRPC.
  void RunCall(std::shared_ptr<Feeder> feeder, std::shared_ptr<CallState> state);
  Received ReceiveGrpc(CallState& state);
  Received ReceiveSocket(CallState& state, PooledSocket& socket);
  // An idle connection to `feeder`'s data port (unless `fresh`), or a new one; null when it has
  // none, or when it cannot be dialled (then paused for kDataPlanePause, said in the log).
  std::unique_ptr<PooledSocket> DataSocket(Feeder& feeder, const CallState& state, bool fresh);
  void Failed(Feeder& feeder, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Available(const Feeder& feeder, const std::string& dataset,
                 std::chrono::steady_clock::time_point now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReapThreads() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<FeederConfig> configured_;
  const bool local_decode_;
  const std::chrono::milliseconds lease_;
  const std::chrono::milliseconds resolve_every_;  // [failpoints] feeder_resolve_ms, else 30 s
  MemoryBudget& budget_;
  const bool tls_;

  mutable std::mutex mu_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<SSL_CTX> feed_tls_ ABSL_GUARDED_BY(mu_);  // null without [tls]
  uint64_t tls_generation_ ABSL_GUARDED_BY(mu_) = 0;      // reloads of the host's certificate
  std::condition_variable stop_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<Feeder>> feeders_ ABSL_GUARDED_BY(mu_);  // by address
  double local_rate_ ABSL_GUARDED_BY(mu_) = 0;  // samples/s of this host's threads; 0 = unknown
  // Per dataset, the part of a round leased (local_decode = true), steered by the rounds'
  // leads; set from the rates at its first round, and again when the feeders available change.
  struct Steering {
    double fraction = -1;
    int available = -1;   // feeders available when `fraction` was set from the rates
    uint64_t steers = 0;  // rounds that steered it, of all its streams
    struct Pace {
      uint64_t last = 0;  // `steers` when the stream last steered, or came
      uint64_t gap = 0;   // `steers` between its last two (0: not known yet)
    };
    std::map<const void*, Pace> streams;
  };
  std::map<std::string, Steering> steering_ ABSL_GUARDED_BY(mu_);
  struct Running {
    std::thread thread;
    std::shared_ptr<CallState> state;
  };
  std::list<Running> threads_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> fallback_samples_{0};
  std::atomic<uint64_t> ahead_samples_{0};
  std::thread resolver_;  // last: starts once the rest is built
};

}  // namespace ringloader::server
