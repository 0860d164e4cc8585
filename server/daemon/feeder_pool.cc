// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/feeder_pool.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <optional>
#include <set>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "server/daemon/feed_frames.h"
#include "server/daemon/feed_socket.h"
#include "server/daemon/feeder_service.h"
#include "server/daemon/stream_manager.h"
#include "server/pipeline/batch_filler.h"
#include "shm/base/x509.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

using Clock = std::chrono::steady_clock;

// Names are resolved again this often; an address gone from its name this many periods is
// forgotten (pods come and go: its entry, channel and /metrics series go too); a refused dataset
// is asked of that address again after this many (the pod behind it may have been replaced).
constexpr std::chrono::seconds kResolveEvery{30};
constexpr int kForgetAfterResolves = 10;
constexpr int kReaskRefusedAfterResolves = 20;
constexpr std::chrono::seconds kMaxPause{30};
// A feeder busy with other hosts (RESOURCE_EXHAUSTED) is asked again after this, no failure.
constexpr std::chrono::milliseconds kBusyPause{500};

// How the part of each round leased is steered (local_decode = true): by this host's lead, the
// samples of rounds to come it decoded while its feeders were late, less those a round decoded
// itself (it fell behind), plus what it could have decoded while it waited (they fell behind),
// as a part of a round. Aimed at kTargetLead: a lead is slack both ways. Each round's lead
// moves the dataset's fraction by kLeadIntegral per round of error, and a stream's own share by
// kLeadGain per round of its latest error; within [kLeastLeased, kMostLeased].
constexpr double kTargetLead = 0.25;
constexpr double kLeadGain = 0.05;
constexpr double kLeadIntegral = 0.01;
constexpr double kLeastLeased = 0.02;
constexpr double kMostLeased = 0.98;
// Fewer samples than this, leased ahead next to a call that holds the rest of a round's tail,
// are left to the round itself.
constexpr size_t kLeastExtraAhead = 4;

// The data plane (feed_socket.h): a connection idle this long is not reused (the feeder closes
// its own after kFeedIdleTimeout); one that cannot be dialled is not tried again for this long,
// its calls going over gRPC meanwhile; a dial has at most this long (within the lease).
constexpr std::chrono::seconds kReuseIdleFor{60};
constexpr std::chrono::seconds kDataPlanePause{30};
constexpr std::chrono::seconds kDialWithin{2};

// What a feeder's answer header must say of a call of `n` samples in `expected` bytes.
absl::Status CheckHeader(const v1::FeedHeader& header, size_t n, uint64_t expected) {
  if (header.payload_bytes() == expected && header.count() <= n) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "its answer holds ", header.count(), " samples in ", header.payload_bytes(), " bytes; ", n,
      " samples take ", expected, " (another transform or version?)"));
}

// A moving average that starts at its first sample.
void Average(double& average, double sample) {
  average = average == 0 ? sample : 0.7 * average + 0.3 * sample;
}

}  // namespace

// A data plane connection, idle in its feeder's pool or in a call's hands.
struct FeederPool::PooledSocket {
  std::unique_ptr<FeedConnection> connection;
  uint64_t generation = 0;  // the host's certificate it was dialled with (tls_generation_)
  std::optional<base::CertificateFacts> cert;  // the feeder's, as its handshake showed it
  bool reused = false;  // taken from the idle ones (the feeder may have closed it meanwhile)
};

struct FeederPool::Feeder {
  std::string configured;  // the [[feeders]] address
  std::string address;     // IP:PORT
  std::string ip;          // of `address`, for its data port
  std::string target;      // the gRPC target for it
  std::string tls_name;    // the name its certificate is checked for (the configured host)
  // Replaced whole when the host's certificate is re-read (SIGHUP); a call keeps its own.
  std::shared_ptr<FeedChannel> stub;
  std::optional<base::CertificateFacts> cert;  // as its latest answered call showed it
  bool present = true;  // in its name's latest resolution
  Clock::time_point gone_since{};  // when it left its name's resolution (if !present)
  int in_flight = 0;
  int failures_in_row = 0;
  Clock::time_point retry_at{};
  struct Refusal {
    std::string why;
    Clock::time_point until;  // asked again from then on
  };
  std::map<std::string, Refusal> refused;  // dataset -> why and until when
  double rate = 0, round_trip_ms = 0;
  // Its rate is measured on the time it was busy for us, not a call's own time: calls started
  // ahead wait there behind the current ones, and would halve it. busy_mark: when the latest call
  // ended, or the first of a busy spell began.
  Clock::time_point busy_mark{};
  double seconds_per_sample = 0;  // moving average; rate = its inverse
  uint64_t samples = 0, calls = 0, lease_failures = 0;
  std::string last_error;
  // Its server.feeder_data_listen port, as its latest gRPC answer told it (0 = none), and
  // until when it is not dialled (a dial failed); its idle connections there.
  uint32_t data_port = 0;
  Clock::time_point data_paused_until{};
  std::vector<std::unique_ptr<PooledSocket>> idle;
  std::string transport;  // how its latest answer came
};

// What a call's transport brought back.
struct FeederPool::Received {
  absl::Status result;
  grpc::StatusCode code = grpc::StatusCode::OK;  // the feeder's own status, when it gave one
  uint32_t count = 0;
  std::vector<grpc::Slice> pieces;  // gRPC: the payload's slices
  std::unique_ptr<uint8_t[]> buffer;  // the data plane: the payload, whole
  std::optional<base::CertificateFacts> cert;
  std::optional<uint32_t> data_port;  // as a gRPC answer told it
  bool replied = false;  // the data plane: a frame came back
  bool in_step = false;  // the data plane: the answer was read whole (the connection serves on)
};

// Shared by a call's thread and the filler's Call.
struct FeederPool::CallState {
  std::shared_ptr<FeedChannel> stub;
  v1::FeedRequest request;
  std::string dataset;
  std::vector<uint64_t> indices;
  uint64_t expected_bytes = 0;
  Reservation held;  // the answer's bytes, from memory_limit
  grpc::ClientContext context;
  Clock::time_point started, deadline;
  Clock::time_point ended;  // the answer's last byte (set with `done`)
  Clock::duration busy{};   // of it, the feeder's busy time for this call alone (with `done`)
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;       // the answer (or its failure) is in
  bool abandoned = false;  // the filler stopped waiting: the outcome counts for nothing
  // `abandoned`, read by the call's thread between frames without the lock: it stops receiving
  // into a buffer whose memory_limit reservation is given back already.
  std::atomic<bool> given_up{false};
  absl::Status status;
  uint32_t count = 0;
  // The answer's payload as it came: gRPC's slices, read in place (the call's thread's until
  // `done`). `held` counts them.
  std::vector<grpc::Slice> pieces;
  std::unique_ptr<uint8_t[]> buffer;  // or, over the data plane, the payload whole
  // The data plane connection the call's thread is using (under `mu`), shut down to cancel it.
  FeedConnection* socket = nullptr;
  std::atomic<bool> finished{false};  // the thread is about to return (joined without waiting)

  // Under `mu`: the call ends as soon as its thread sees it (gRPC's call, or the socket's).
  void CancelLocked() {
    context.TryCancel();
    if (socket != nullptr) socket->Shutdown();
  }
};

class FeederPool::Call final : public pipeline::RemoteCall {
 public:
  Call(FeederPool& pool, std::shared_ptr<Feeder> feeder, std::shared_ptr<CallState> state)
      : pool_(pool), feeder_(std::move(feeder)), state_(std::move(state)) {}
  ~Call() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->done) {
      state_->abandoned = true;
      state_->given_up = true;
      state_->CancelLocked();
    }
    // The answer's memory goes back now, not when the thread is next reaped (a thread still
    // receiving frees what it holds as it ends).
    std::vector<grpc::Slice>().swap(state_->pieces);
    state_->buffer.reset();
    state_->held = Reservation();
  }
  const std::vector<uint64_t>& indices() const override { return state_->indices; }
  std::optional<absl::Status> Wait(std::chrono::milliseconds slice) override {
    {
      std::unique_lock<std::mutex> lock(state_->mu);
      const auto until = std::min(state_->deadline, Clock::now() + slice);
      if (state_->cv.wait_until(lock, until, [&] { return state_->done; })) {
        return state_->status;
      }
      if (Clock::now() < state_->deadline) return std::nullopt;
      state_->abandoned = true;
      state_->given_up = true;
      state_->CancelLocked();
    }
    const std::string why = absl::StrCat("no answer within server.feeder_lease_ms (",
                                         pool_.lease_.count(), " ms)");
    std::lock_guard<std::mutex> lock(pool_.mu_);
    pool_.Failed(*feeder_, why);
    return absl::DeadlineExceededError(why);
  }
  bool Answered() const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done || Clock::now() >= state_->deadline;
  }
  uint32_t count() const override { return state_->count; }
  pipeline::AnswerView payload() const override {
    if (state_->buffer) return pipeline::AnswerView({state_->buffer.get(), state_->expected_bytes});
    std::vector<std::span<const uint8_t>> pieces;
    pieces.reserve(state_->pieces.size());
    for (const grpc::Slice& piece : state_->pieces) {
      pieces.emplace_back(piece.begin(), piece.size());
    }
    return pipeline::AnswerView(std::move(pieces));
  }
  void Accept(uint32_t used) override {
    std::lock_guard<std::mutex> lock(pool_.mu_);
    // Only an answer the filler used clears the feeder's failures and counts for its rate.
    feeder_->failures_in_row = 0;
    const double seconds = std::chrono::duration<double>(state_->ended - state_->started).count();
    Average(feeder_->round_trip_ms, seconds * 1e3);
    const double busy = std::chrono::duration<double>(state_->busy).count();
    if (busy > 0) {
      // Averaged per sample, not as rates: two calls answered together (one long, one at once)
      // average to the right time.
      Average(feeder_->seconds_per_sample, busy / static_cast<double>(state_->indices.size()));
      feeder_->rate = 1 / feeder_->seconds_per_sample;
    }
    feeder_->samples += used;
    ++feeder_->calls;
  }
  void Reject(const absl::Status& why) override {
    std::lock_guard<std::mutex> lock(pool_.mu_);
    pool_.Failed(*feeder_, absl::StrCat("a bad answer: ", why.message()));
  }

 private:
  FeederPool& pool_;
  std::shared_ptr<Feeder> feeder_;
  std::shared_ptr<CallState> state_;
};

class FeederPool::StreamView final : public pipeline::RemoteDecode {
 public:
  StreamView(FeederPool& pool, std::string dataset_name, const pipeline::Dataset& dataset,
             const v1::StreamSpec& spec, const image::DecodeLimits& limits)
      : pool_(pool), dataset_name(std::move(dataset_name)), dataset(dataset),
        transform(ToTransform(spec)) {
    base.set_dataset(this->dataset_name);
    base.set_dataset_fingerprint(dataset.fingerprint());
    base.set_label_source(LabelSource(dataset));
    base.set_payload_xxh3(true);
    *base.mutable_spec() = spec;
    v1::FeedLimits* l = base.mutable_limits();
    l->set_max_pixels(limits.max_pixels);
    l->set_max_file_bytes(limits.max_file_bytes);
    l->set_warnings_are_errors(limits.warnings_are_errors);
    l->set_max_scans(limits.max_scans);
    pool_.AddStream(this->dataset_name, this);
  }
  ~StreamView() override { pool_.RemoveStream(dataset_name, this); }
  uint64_t Share(uint64_t k) override {
    return pool_.ShareFor(dataset_name, k, -kLeadGain * lead_error_);
  }
  std::vector<std::unique_ptr<pipeline::RemoteCall>> Start(
      uint64_t epoch, std::span<const uint64_t> indices) override {
    return pool_.StartFor(*this, epoch, indices);
  }
  void LocalDone(uint64_t samples, std::chrono::nanoseconds elapsed) override {
    pool_.LocalDone(samples, elapsed);
  }
  void RoundEnded(uint64_t k, uint64_t behind, std::chrono::nanoseconds waited) override {
    if (k == 0) return;
    const double could_have = std::chrono::duration<double>(waited).count() *
                              static_cast<double>(pool_.local_rate());
    const double lead =
        static_cast<double>(ahead_.HeldHere()) - static_cast<double>(behind) + could_have;
    // Bounded: one answer late by a whole lease must not throw the share to its floor.
    lead_error_ = std::clamp(lead / static_cast<double>(k), -1.25, 2.0) - kTargetLead;
    pool_.Steer(dataset_name, this, lead_error_);
  }
  void Ahead(uint64_t epoch, std::span<const uint64_t> indices) override {
    const std::vector<uint64_t> fresh = ahead_.Fresh(epoch, indices, kLeastExtraAhead);
    for (auto& call : pool_.StartFor(*this, epoch, fresh)) ahead_.Add(epoch, std::move(call));
  }
  std::vector<std::unique_ptr<pipeline::RemoteCall>> Claim(uint64_t epoch,
                                                           std::span<const uint64_t> indices,
                                                           bool batch_begins) override {
    return ahead_.Claim(epoch, indices, batch_begins);
  }
  void Keep(uint64_t epoch, std::unique_ptr<pipeline::RemoteCall> call) override {
    pool_.ahead_samples_.fetch_add(call->count(), std::memory_order_relaxed);
    ahead_.Add(epoch, std::move(call));
  }
  std::vector<uint64_t> Unheld(uint64_t epoch, std::span<const uint64_t> indices) const override {
    return ahead_.Fresh(epoch, indices, 0);
  }

  FeederPool& pool_;
  const std::string dataset_name;
  const pipeline::Dataset& dataset;
  const image::TransformSpec transform;
  v1::FeedRequest base;  // all but epoch and indices

 private:
  pipeline::AheadCalls ahead_;  // the stream's producer alone uses a view
  double lead_error_ = 0;        // the latest round's lead less kTargetLead, in rounds
};

absl::StatusOr<std::unique_ptr<FeederPool>> FeederPool::Start(const DaemonConfig& config,
                                                              MemoryBudget& budget) {
  absl::StatusOr<Dialling> credentials = Credentials(config.tls);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<FeederPool>(new FeederPool(config, budget, *std::move(credentials)));
}

FeederPool::FeederPool(const DaemonConfig& config, MemoryBudget& budget, Dialling credentials)
    : configured_(config.feeders),
      local_decode_(config.server.local_decode),
      lease_(config.server.feeder_lease_ms),
      resolve_every_(config.failpoints.feeder_resolve_ms > 0
                         ? std::chrono::milliseconds(config.failpoints.feeder_resolve_ms)
                         : std::chrono::milliseconds(kResolveEvery)),
      budget_(budget),
      tls_(config.tls.enabled()),
      credentials_(std::move(credentials.grpc)),
      feed_tls_(std::move(credentials.data)) {
  Resolve(/*numeric_only=*/true);
  resolver_ = std::thread([this] { ResolveLoop(); });
}

FeederPool::~FeederPool() {
  std::list<Running> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  stop_cv_.notify_all();
  for (Running& r : threads) {
    std::lock_guard<std::mutex> lock(r.state->mu);
    r.state->CancelLocked();
  }
  for (Running& r : threads) r.thread.join();
  resolver_.join();
}

std::unique_ptr<pipeline::RemoteDecode> FeederPool::ForStream(const std::string& dataset_name,
                                                              const pipeline::Dataset& dataset,
                                                              const v1::StreamSpec& spec,
                                                              const image::DecodeLimits& limits) {
  return std::make_unique<StreamView>(*this, dataset_name, dataset, spec, limits);
}

std::shared_ptr<FeederPool::FeedChannel> FeederPool::MakeStub(const Feeder& feeder) const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(4 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2'000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A stream window the size of a typical answer: with gRPC's 64 KiB, an answer through a 2 ms
  // delay each way came at a tenth of the link's speed (feeder_bench). Bounded: at most
  // kMaxFeedsPerHost calls per feeder, each read as it comes.
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  // The feeder's certificate names the host as configured, not each of its addresses.
  if (tls_) args.SetSslTargetNameOverride(feeder.tls_name);
  auto stub = std::make_shared<FeedChannel>();
  stub->channel = grpc::CreateCustomChannel(feeder.target, credentials_, args);
  stub->method = std::make_unique<grpc::internal::RpcMethod>(
      kFeedSamplesMethod, grpc::internal::RpcMethod::SERVER_STREAMING, stub->channel);
  return stub;
}

absl::StatusOr<FeederPool::Dialling> FeederPool::Credentials(const TlsConfig& tls) {
  if (!tls.enabled()) return Dialling{grpc::InsecureChannelCredentials(), nullptr};
  absl::StatusOr<base::TlsIdentity> identity =
      base::LoadTlsIdentity(base::TlsPaths{tls.ca, tls.cert, tls.key}, std::time(nullptr));
  if (!identity.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("[[feeders]] dial with [tls]'s certificate: ", identity.status().message()));
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = identity->ca_pem;
  ssl.pem_private_key = identity->key_pem;
  ssl.pem_cert_chain = identity->cert_pem;
  absl::StatusOr<std::shared_ptr<SSL_CTX>> data = MakeFeedTlsContext(*identity, /*server=*/false);
  if (!data.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("[[feeders]] dial with [tls]'s certificate: ", data.status().message()));
  }
  return Dialling{grpc::SslCredentials(ssl), *std::move(data)};
}

absl::Status FeederPool::ReloadTls(const TlsConfig& tls) {
  if (!tls_ || !tls.enabled()) return absl::OkStatus();
  absl::StatusOr<Dialling> credentials = Credentials(tls);
  if (!credentials.ok()) return credentials.status();
  std::lock_guard<std::mutex> lock(mu_);
  credentials_ = std::move(credentials->grpc);
  feed_tls_ = std::move(credentials->data);
  ++tls_generation_;
  // New channels and data plane connections: the next calls handshake with the new
  // certificate; calls in flight keep theirs to the end.
  for (const auto& feeder : feeders_) {
    feeder->stub = MakeStub(*feeder);
    feeder->idle.clear();
  }
  return absl::OkStatus();
}

void FeederPool::ResolveLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    Resolve(/*numeric_only=*/false);
    lock.lock();
    stop_cv_.wait_for(lock, resolve_every_, [this] { return stopping_; });
  }
}

void FeederPool::Resolve(bool numeric_only) {
  for (const FeederConfig& f : configured_) {
    std::string host, port;
    if (!SplitHostPort(f.address, &host, &port)) continue;  // (ValidateListen refused it)
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = numeric_only ? AI_NUMERICHOST : 0;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0) {
      if (!numeric_only) {
        SPDLOG_WARN("feeder {}: cannot resolve {}: {} (its addresses so far stay in use)",
                    f.address, host, gai_strerror(rc));
      }
      continue;
    }
    std::set<std::string> addresses;
    std::map<std::string, std::string> targets;  // address -> gRPC target
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      char ip[INET6_ADDRSTRLEN] = {};
      const bool v6 = a->ai_family == AF_INET6;
      const void* where =
          v6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr)
             : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr);
      if (inet_ntop(a->ai_family, where, ip, sizeof(ip)) == nullptr) continue;
      const std::string address =
          v6 ? absl::StrCat("[", ip, "]:", port) : absl::StrCat(ip, ":", port);
      addresses.insert(address);
      targets[address] = absl::StrCat(v6 ? "ipv6:" : "ipv4:", address);
    }
    freeaddrinfo(found);
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    for (const auto& feeder : feeders_) {
      if (feeder->configured != f.address) continue;
      const bool present = addresses.count(feeder->address) > 0;
      if (feeder->present && !present) feeder->gone_since = now;
      feeder->present = present;
    }
    // Calls in flight hold their feeder (a shared_ptr): forgetting one here ends nothing.
    std::erase_if(feeders_, [&](const std::shared_ptr<Feeder>& feeder) {
      const bool forget = feeder->configured == f.address && !feeder->present &&
                          now - feeder->gone_since >= kForgetAfterResolves * resolve_every_;
      if (forget) {
        SPDLOG_INFO("feeder {}: {} forgotten, gone from its addresses for {} s", f.address,
                    feeder->address,
                    std::chrono::duration_cast<std::chrono::seconds>(now - feeder->gone_since)
                        .count());
      }
      return forget;
    });
    for (const std::string& address : addresses) {
      const bool known = std::any_of(feeders_.begin(), feeders_.end(), [&](const auto& feeder) {
        return feeder->configured == f.address && feeder->address == address;
      });
      if (known) continue;
      auto feeder = std::make_shared<Feeder>();
      feeder->configured = f.address;
      feeder->address = address;
      feeder->target = targets[address];
      std::string ip, ignored_port;
      if (SplitHostPort(address, &ip, &ignored_port)) feeder->ip = ip;
      feeder->tls_name = host;
      feeder->stub = MakeStub(*feeder);
      SPDLOG_INFO("feeder {}: drawing decoded samples from {}", f.address, address);
      feeders_.push_back(std::move(feeder));
    }
  }
}

bool FeederPool::Available(const Feeder& feeder, const std::string& dataset,
                           Clock::time_point now) const {
  const auto refusal = feeder.refused.find(dataset);
  return feeder.present && now >= feeder.retry_at && feeder.in_flight < kMaxFeedsPerHost &&
         (refusal == feeder.refused.end() || now >= refusal->second.until);
}

double FeederPool::Unmeasured() const {
  double sum = 0;
  int measured = 0;
  for (const auto& feeder : feeders_) {
    if (feeder->rate > 0) {
      sum += feeder->rate;
      ++measured;
    }
  }
  if (measured > 0) return sum / measured;
  return local_rate_ > 0 ? local_rate_ : 1;
}

uint64_t FeederPool::ShareFor(const std::string& dataset, uint64_t k, double adjust) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  const double local = local_rate_ > 0 ? local_rate_ : 1;
  const double unmeasured = Unmeasured();
  double remote = 0;
  int available = 0;
  for (const auto& feeder : feeders_) {
    if (!Available(*feeder, dataset, now)) continue;
    remote += feeder->rate > 0 ? feeder->rate : unmeasured;
    ++available;
  }
  if (remote == 0) {
    if (!local_decode_) fallback_samples_.fetch_add(k);
    return 0;
  }
  if (!local_decode_) return k;
  // Rates measured on each side start it, and start it again when feeders come or go (a
  // paused one, a refusal); the rounds' leads steer it from there (Steer). Per dataset:
  // their samples cost differently here and there.
  Steering& steering = steering_[dataset];
  if (steering.fraction < 0 || steering.available != available) {
    steering.fraction = std::clamp(remote / (remote + local), kLeastLeased, kMostLeased);
    steering.available = available;
  }
  const double fraction = std::clamp(steering.fraction + adjust, kLeastLeased, kMostLeased);
  return static_cast<uint64_t>(std::llround(static_cast<double>(k) * fraction));
}

void FeederPool::Steer(const std::string& dataset, const void* stream, double lead_error) {
  // A round is quickest when both sides end together, and rates cannot say where that is: each
  // side's measure includes the other's load on this host (receiving an answer takes the cores
  // the local decodes use) and a feeder's other hosts. The lead can: it grows while the feeders
  // are given too much, and shrinks while this host is.
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = steering_.find(dataset);
  if (it == steering_.end()) return;
  Steering& steering = it->second;
  const uint64_t now = ++steering.steers;
  Steering::Pace& pace = steering.streams[stream];
  pace.gap = now - pace.last;
  pace.last = now;
  if (steering.fraction < 0) return;
  // Each of the dataset's streams steers it once a round: N streams at kLeadIntegral each would
  // move it N times as fast, and overshoot where one stream settles. N counts those steering: a
  // stream steers once in each of its own gaps (N steers, at one pace), so one not seen in twice
  // that many (a validation stream opened and idle, a paused trainer) is not steering, and would
  // only slow the others' step. A slower stream's gap is longer: it still counts between its
  // rounds.
  const uint64_t streams = steering.streams.size();
  int steering_streams = 0;
  for (const auto& [other, its] : steering.streams) {
    if (now - its.last < 2 * std::max(its.gap, streams)) ++steering_streams;
  }
  steering.fraction =
      std::clamp(steering.fraction - kLeadIntegral * lead_error / std::max(1, steering_streams),
                 kLeastLeased, kMostLeased);
}

void FeederPool::AddStream(const std::string& dataset, const void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Steering& steering = steering_[dataset];
  steering.streams[stream] = Steering::Pace{steering.steers, 0};
}

void FeederPool::RemoveStream(const std::string& dataset, const void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  steering_[dataset].streams.erase(stream);
}

std::vector<std::unique_ptr<pipeline::RemoteCall>> FeederPool::StartFor(
    const StreamView& view, uint64_t epoch, std::span<const uint64_t> indices) {
  std::vector<std::unique_ptr<pipeline::RemoteCall>> calls;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return calls;
  ReapThreads();
  const auto now = Clock::now();
  const double unmeasured = Unmeasured();
  std::vector<std::pair<std::shared_ptr<Feeder>, double>> takers;
  double total = 0;
  for (const auto& feeder : feeders_) {
    if (!Available(*feeder, view.dataset_name, now)) continue;
    takers.emplace_back(feeder, feeder->rate > 0 ? feeder->rate : unmeasured);
    total += takers.back().second;
  }
  size_t next = 0;
  for (size_t t = 0; t < takers.size() && next < indices.size(); ++t) {
    auto& [feeder, rate] = takers[t];
    // Its share by rate (the last taker takes the rest), in calls of at most kMaxFeedSamples;
    // at least one sample, so that a feeder slow once is measured again.
    size_t share = t + 1 == takers.size()
                       ? indices.size() - next
                       : std::max<size_t>(1, static_cast<size_t>(std::llround(
                                                 static_cast<double>(indices.size()) * rate /
                                                 total)));
    share = std::min(share, indices.size() - next);
    while (share > 0 && feeder->in_flight < kMaxFeedsPerHost) {
      const size_t n = std::min<size_t>(share, kMaxFeedSamples);
      const uint64_t bytes =
          pipeline::ComputeBatchLayout(static_cast<uint32_t>(n), view.transform, &view.dataset)
              .total_bytes;
      absl::StatusOr<Reservation> held =
          budget_.Reserve(bytes, absl::StrCat("a feeder's answer of ", n, " samples"),
                          std::chrono::milliseconds(0));
      if (!held.ok()) break;  // memory is short: these are decoded here
      auto state = std::make_shared<CallState>();
      state->stub = feeder->stub;
      state->request = view.base;
      state->request.set_epoch(epoch);
      for (size_t i = next; i < next + n; ++i) {
        state->request.add_indices(static_cast<uint32_t>(indices[i]));
        state->indices.push_back(indices[i]);
      }
      state->dataset = view.dataset_name;
      state->expected_bytes = bytes;
      state->held = *std::move(held);
      state->started = Clock::now();
      state->deadline = state->started + lease_;
      std::thread thread;
      try {
        thread = std::thread([this, feeder, state] { RunCall(feeder, state); });
      } catch (const std::system_error& e) {  // no thread to be had: these are decoded here
        SPDLOG_WARN("feeder {}: cannot start a call's thread ({}); decoding here",
                    feeder->address, e.what());
        break;
      }
      if (feeder->in_flight++ == 0) feeder->busy_mark = state->started;  // a busy spell begins
      threads_.push_back(Running{std::move(thread), state});
      calls.push_back(std::make_unique<Call>(*this, feeder, state));
      next += n;
      share -= n;
    }
  }
  if (!local_decode_ && next < indices.size()) fallback_samples_.fetch_add(indices.size() - next);
  return calls;
}

std::unique_ptr<FeederPool::PooledSocket> FeederPool::DataSocket(Feeder& feeder,
                                                                 const CallState& state,
                                                                 bool fresh) {
  std::shared_ptr<SSL_CTX> context;
  uint32_t port = 0;
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    if (feeder.data_port == 0 || !feed_tls_ || feeder.ip.empty() ||
        now < feeder.data_paused_until) {
      return nullptr;
    }
    // Those the feeder closed (idle, restarted), or idle long enough that it may have, go;
    // the one used last is taken.
    std::erase_if(feeder.idle, [&](const std::unique_ptr<PooledSocket>& idle) {
      return now - idle->connection->last_used >= kReuseIdleFor ||
             idle->connection->PeerSpoke();
    });
    if (!fresh && !feeder.idle.empty()) {
      std::unique_ptr<PooledSocket> idle = std::move(feeder.idle.back());
      feeder.idle.pop_back();
      idle->reused = true;
      return idle;
    }
    context = feed_tls_;
    port = feeder.data_port;
    generation = tls_generation_;
  }
  const auto deadline = std::min(state.deadline, Clock::now() + kDialWithin);
  absl::StatusOr<std::unique_ptr<FeedConnection>> dialled =
      FeedConnection::Dial(feeder.ip, std::to_string(port), feeder.tls_name, context.get(),
                           deadline);
  // Out of the lease's time, not the port's fault: no pause.
  if (!dialled.ok() && Clock::now() >= state.deadline) return nullptr;
  if (!dialled.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    feeder.data_paused_until = Clock::now() + kDataPlanePause;
    SPDLOG_WARN("feeder {}: its data port {} cannot be used ({}): its answers come over gRPC, and "
                "the port is dialled again in {} s",
                feeder.address, port, std::string(dialled.status().message()),
                kDataPlanePause.count());
    return nullptr;
  }
  auto socket = std::make_unique<PooledSocket>();
  socket->connection = *std::move(dialled);
  socket->generation = generation;
  absl::StatusOr<base::CertificateFacts> facts =
      base::DescribeCertificate(socket->connection->PeerCertificatePem());
  if (facts.ok()) socket->cert = *std::move(facts);
  return socket;
}

FeederPool::Received FeederPool::ReceiveSocket(CallState& state, PooledSocket& socket) {
  Received got;
  FeedConnection& c = *socket.connection;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.abandoned) {
      got.result = absl::CancelledError("given up before it was sent");
      return got;
    }
    state.socket = &c;
  }
  const size_t n = state.indices.size();
  const auto deadline = state.deadline + std::chrono::seconds(1);  // as gRPC's (RunCall)
  got.result = [&]() -> absl::Status {
    if (absl::Status s = c.WriteFrame(kFeedFrameRequest, state.request, deadline); !s.ok()) {
      return s;
    }
    absl::StatusOr<FeedConnection::Frame> frame = c.ReadFrame(deadline);
    if (!frame.ok()) return frame.status();
    got.replied = true;
    if (frame->type == kFeedFrameError) {
      v1::FeedError error;
      if (!error.ParseFromString(frame->bytes) || error.code() <= 0 || error.code() > 16) {
        return absl::DataLossError("its answer held an error frame that is not one");
      }
      got.in_step = true;
      got.code = static_cast<grpc::StatusCode>(error.code());
      return absl::Status(static_cast<absl::StatusCode>(error.code()), error.message());
    }
    v1::FeedHeader header;
    if (frame->type != kFeedFrameHeader || !header.ParseFromString(frame->bytes)) {
      return absl::DataLossError("its answer did not start with a header");
    }
    if (absl::Status s = CheckHeader(header, n, state.expected_bytes); !s.ok()) return s;
    const bool xxh3 = header.has_payload_xxh3();  // as asked; a feeder older than it: XXH64
    PayloadHash hash(xxh3 ? PayloadHash::Kind::kXxh3 : PayloadHash::Kind::kXxh64);
    got.buffer = std::make_unique_for_overwrite<uint8_t[]>(state.expected_bytes);
    // Decrypted straight into the buffer, hashed record by record while in cache.
    absl::Status read = c.Read({got.buffer.get(), state.expected_bytes}, deadline,
                               [&](std::span<const uint8_t> piece) {
                                 if (state.given_up) {  // its memory is given back: stop
                                   return absl::CancelledError("given up while its answer came");
                                 }
                                 hash.Update(piece);
                                 return absl::OkStatus();
                               });
    if (!read.ok()) return read;
    if (hash.Digest() != (xxh3 ? header.payload_xxh3() : header.payload_xxh64())) {
      return absl::DataLossError(absl::StrCat("its answer's ", xxh3 ? "XXH3" : "XXH64",
                                              " is not the one its header gave"));
    }
    got.count = header.count();
    got.in_step = true;
    return absl::OkStatus();
  }();
  {
    std::lock_guard<std::mutex> lock(state.mu);
    state.socket = nullptr;
  }
  if (!got.result.ok()) got.buffer.reset();
  got.cert = socket.cert;
  return got;
}

FeederPool::Received FeederPool::ReceiveGrpc(CallState& state) {
  Received got;
  if (state.given_up) {  // while a data port was dialled
    got.result = absl::CancelledError("given up before it was sent");
    return got;
  }
  // The lease's end, and a second for the answer's last bytes to come.
  state.context.set_deadline(std::chrono::system_clock::now() + (state.deadline - Clock::now()) +
                             std::chrono::seconds(1));
  // Raw (feed_frames.h): the payload frames' slices are kept as they came, not copied.
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          state.stub->channel.get(), *state.stub->method, &state.context, state.request));
  const size_t n = state.indices.size();
  absl::Status result;
  std::vector<grpc::Slice>& pieces = got.pieces;  // the answer's payload
  size_t received = 0;
  grpc::ByteBuffer frame;
  uint64_t checksum = 0;
  std::optional<PayloadHash> hash;  // frame by frame as each arrives, while its bytes are in cache
  if (reader->Read(&frame)) {
    absl::StatusOr<ReadFrame> first = ParseFrame(frame, 0, nullptr, nullptr);
    if (!first.ok() || !first->header) {
      result = absl::DataLossError("its answer did not start with a header");
    } else if (absl::Status s = CheckHeader(*first->header, n, state.expected_bytes); !s.ok()) {
      result = s;
    } else {
      got.count = first->header->count();
      got.data_port = first->header->data_port();
      // XXH3 as asked; a feeder older than it sends XXH64.
      const bool xxh3 = first->header->has_payload_xxh3();
      checksum = xxh3 ? first->header->payload_xxh3() : first->header->payload_xxh64();
      hash.emplace(xxh3 ? PayloadHash::Kind::kXxh3 : PayloadHash::Kind::kXxh64);
      while (result.ok() && reader->Read(&frame)) {
        if (state.given_up) {  // its memory is given back: receive no more into it
          result = absl::CancelledError("given up while its answer came");
          std::vector<grpc::Slice>().swap(pieces);
          break;
        }
        absl::StatusOr<ReadFrame> part =
            ParseFrame(frame, state.expected_bytes - received, &*hash, &pieces);
        if (!part.ok()) {
          result = part.status();
        } else if (part->header) {
          result = absl::DataLossError("its answer held a second header");
        } else {
          received += part->payload_bytes;
        }
      }
    }
  }
  if (!result.ok()) state.context.TryCancel();
  const grpc::Status finished = reader->Finish();
  if (result.ok() && !finished.ok()) {
    got.code = finished.error_code();
    result = absl::Status(static_cast<absl::StatusCode>(finished.error_code()),
                          finished.error_message());
  }
  if (result.ok() && received != state.expected_bytes) {
    result = absl::DataLossError(
        absl::StrCat("its answer ended after ", received, " of ", state.expected_bytes,
                     " bytes"));
  }
  if (result.ok() && hash && hash->Digest() != checksum) {
    result = absl::DataLossError(absl::StrCat(
        "its answer's ", hash->kind() == PayloadHash::Kind::kXxh3 ? "XXH3" : "XXH64",
        " is not the one its header gave"));
  }
  // The feeder's certificate, for its days left in stats (the handshake checked it already).
  if (result.ok() && tls_) {
    const std::shared_ptr<const grpc::AuthContext> auth = state.context.auth_context();
    const std::vector<grpc::string_ref> pems =
        auth ? auth->FindPropertyValues("x509_pem_cert") : std::vector<grpc::string_ref>();
    if (!pems.empty()) {
      absl::StatusOr<base::CertificateFacts> facts =
          base::DescribeCertificate(std::string_view(pems[0].data(), pems[0].size()));
      if (facts.ok()) got.cert = *std::move(facts);
    }
  }
  if (!result.ok()) std::vector<grpc::Slice>().swap(pieces);
  got.result = std::move(result);
  return got;
}

void FeederPool::RunCall(std::shared_ptr<Feeder> feeder, std::shared_ptr<CallState> state) {
  pthread_setname_np(pthread_self(), "rl-feeder-call");
  std::unique_ptr<PooledSocket> socket = DataSocket(*feeder, *state, /*fresh=*/false);
  Received got = socket ? ReceiveSocket(*state, *socket) : ReceiveGrpc(*state);
  if (socket && socket->reused && !got.replied &&
      got.result.code() == absl::StatusCode::kUnavailable && !state->given_up &&
      Clock::now() + kDialWithin < state->deadline) {
    // An idle connection the feeder closed as it was taken (its idle timeout, a restart): the
    // call was not answered, so once more on a new one.
    socket = DataSocket(*feeder, *state, /*fresh=*/true);
    got = socket ? ReceiveSocket(*state, *socket) : ReceiveGrpc(*state);
  }
  const absl::Status result = got.result;
  const grpc::StatusCode code = got.code;
  const uint32_t count = got.count;
  const auto ended = Clock::now();
  Clock::duration busy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy = ended - std::max(state->started, feeder->busy_mark);
    feeder->busy_mark = std::max(feeder->busy_mark, ended);
    if (result.ok() && got.cert) feeder->cert = std::move(got.cert);
    if (got.data_port) feeder->data_port = *got.data_port;  // the port may come, go, or move
    if (result.ok()) feeder->transport = socket ? "tls socket" : "grpc";
    // A connection that carried a whole answer, or a refusal, is kept for the next call, unless
    // the host's certificate was re-read since it was dialled.
    if (socket && (result.ok() || got.in_step) && socket->generation == tls_generation_ &&
        feeder->idle.size() < static_cast<size_t>(kMaxFeedsPerHost)) {
      socket->connection->last_used = ended;
      feeder->idle.push_back(std::move(socket));
    }
    // Before the filler hears it is done: its next round must find the feeder free of it (else,
    // still counted against kMaxFeedsPerHost, the feeder was not Available and a whole round fell
    // back to this host: feeder_test's "local_decode = false" saw 8 fallback samples under load).
    --feeder->in_flight;
  }
  bool abandoned = false;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->busy = busy;
    abandoned = state->abandoned;
    state->done = true;
    state->status = result;
    state->count = count;
    state->ended = ended;
    if (!abandoned && result.ok()) {
      state->pieces = std::move(got.pieces);
      state->buffer = std::move(got.buffer);
    }
    if (abandoned) state->held = Reservation();  // nobody reads it
    state->cv.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abandoned) {
      if (result.ok()) {
        // Counted by the filler's Accept or Reject, once it has checked the answer.
      } else if (code == grpc::StatusCode::FAILED_PRECONDITION ||
                 code == grpc::StatusCode::NOT_FOUND ||
                 code == grpc::StatusCode::INVALID_ARGUMENT) {
        // Its files or rules are not this host's: that dataset is not asked of it again for a
        // while (the pod behind the address may be replaced, its mount fixed).
        ++feeder->lease_failures;
        const std::string why(result.message());
        feeder->last_error = why;
        const auto again = Clock::now() + kReaskRefusedAfterResolves * resolve_every_;
        auto [it, first] = feeder->refused.try_emplace(state->dataset, Feeder::Refusal{why, again});
        if (first || it->second.why != why) {
          SPDLOG_ERROR("feeder {} refused dataset \"{}\", decoded elsewhere (asked again in {} "
                       "s): {}", feeder->address, state->dataset,
                       std::chrono::duration_cast<std::chrono::seconds>(
                           kReaskRefusedAfterResolves * resolve_every_).count(), why);
        }
        it->second = Feeder::Refusal{why, again};
      } else if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++feeder->lease_failures;  // busy with other hosts: asked again shortly, no fault
        feeder->last_error = std::string(result.message());
        feeder->retry_at = Clock::now() + kBusyPause;
      } else {
        Failed(*feeder, std::string(result.message()));
      }
    }
  }
  state->finished = true;
}

void FeederPool::Failed(Feeder& feeder, const std::string& why) {
  ++feeder.lease_failures;
  ++feeder.failures_in_row;
  feeder.last_error = why;
  const auto pause = std::min<std::chrono::milliseconds>(
      kMaxPause, std::chrono::milliseconds(1000 << std::min(feeder.failures_in_row - 1, 5)));
  feeder.retry_at = Clock::now() + pause;
  if (feeder.failures_in_row == 1 || feeder.failures_in_row % 10 == 0) {
    SPDLOG_WARN("feeder {}: {} (its samples are decoded elsewhere; asked again in {} ms, {} "
                "failure(s) in a row)",
                feeder.address, why, pause.count(), feeder.failures_in_row);
  }
}

void FeederPool::ReapThreads() {
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (it->state->finished) {
      it->thread.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
}

void FeederPool::LocalDone(uint64_t samples, std::chrono::nanoseconds elapsed) {
  const double seconds = std::chrono::duration<double>(elapsed).count();
  if (seconds <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Average(local_rate_, static_cast<double>(samples) / seconds);
}

uint64_t FeederPool::local_rate() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint64_t>(local_rate_);
}

std::vector<v1::FeederStatus> FeederPool::Status() const {
  std::vector<v1::FeederStatus> out;
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (const auto& feeder : feeders_) {
    v1::FeederStatus s;
    s.set_address(feeder->address);
    s.set_configured(feeder->configured);
    s.set_state(!feeder->present ? "gone" : now < feeder->retry_at ? "backoff" : "up");
    s.set_samples(feeder->samples);
    s.set_calls(feeder->calls);
    s.set_lease_failures(feeder->lease_failures);
    s.set_round_trip_ms(feeder->round_trip_ms);
    s.set_samples_per_second(feeder->rate);
    s.set_last_error(feeder->last_error);
    for (const auto& [dataset, refusal] : feeder->refused) {
      if (now < refusal.until) s.add_refused_datasets(absl::StrCat(dataset, ": ", refusal.why));
    }
    s.set_in_flight(static_cast<uint32_t>(feeder->in_flight));
    if (feeder->cert) {
      s.set_cert_days_left(feeder->cert->DaysLeft(std::time(nullptr)));
      s.set_cert_subject(feeder->cert->subject);
    }
    s.set_transport(feeder->transport);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ringloader::server
