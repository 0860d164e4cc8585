// SPDX-License-Identifier: Apache-2.0
// Client, Connection, errors and dtypes. The stream logic lives in stream.cc.
#include "client/client.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/channel.h"
#include "client/internal.h"
#include "client/retry.h"
#include "grpcpp/client_context.h"
#include "proto/health.grpc.pb.h"

namespace ringloader::client {
namespace {

// A leak on purpose (a forked child's inherited gRPC objects): not a finding for LeakSanitizer.
template <typename T>
void IgnoreLeak(T* object) {
#if defined(__SANITIZE_ADDRESS__)
  __lsan_ignore_object(object);
#else
  (void)object;
#endif
}

}  // namespace

const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kDataLoss:
      return "data_loss";
    case ErrorCode::kFailedPrecondition:
      return "failed_precondition";
    case ErrorCode::kInternal:
      return "internal";
    case ErrorCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case ErrorCode::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
    case DType::kInt8:
    case DType::kBool:
      return 1;
    case DType::kInt16:
    case DType::kUint16:
    case DType::kFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
    case DType::kUint32:
      return 4;
    case DType::kInt64:
    case DType::kUint64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUint8: return "uint8";
    case DType::kFloat32: return "float32";
    case DType::kInt64: return "int64";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kUint16: return "uint16";
    case DType::kInt32: return "int32";
    case DType::kUint32: return "uint32";
    case DType::kUint64: return "uint64";
    case DType::kFloat16: return "float16";
    case DType::kFloat64: return "float64";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

std::string DefaultEndpoint() {
  const char* env = std::getenv("RINGLOADER_ENDPOINT");
  if (env != nullptr && *env != '\0') return env;
  return "unix:/run/ringloader/ringloader.sock";
}

std::string HealthStatus(const std::string& endpoint, std::chrono::milliseconds timeout) {
  absl::StatusOr<std::string> target = GrpcTarget(endpoint);
  if (!target.ok()) throw Error(ErrorCode::kInvalidArgument, std::string(target.status().message()));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(*target);
  if (!channel.ok()) throw Error(ErrorCode::kInvalidArgument, std::string(channel.status().message()));
  auto stub = grpc::health::v1::Health::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::health::v1::HealthCheckRequest request;  // service "" = the daemon as a whole
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (status.ok()) {
    return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    throw Error(ErrorCode::kUnavailable,
                absl::StrCat("no daemon answers at ", endpoint, ": ", DiagnoseNoConnection(endpoint)));
  }
  throw Error(ErrorCode::kInternal,
              absl::StrCat("health check of ", endpoint, " failed: ", status.error_message()));
}

v1::GetStatsResponse FetchDaemonStats(const std::string& endpoint,
                                      std::chrono::milliseconds timeout) {
  absl::StatusOr<std::string> target = GrpcTarget(endpoint);
  if (!target.ok()) throw Error(ErrorCode::kInvalidArgument, std::string(target.status().message()));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(*target);
  if (!channel.ok()) throw Error(ErrorCode::kInvalidArgument, std::string(channel.status().message()));
  auto stub = v1::Loader::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::GetStatsResponse response;
  const grpc::Status status = stub->GetStats(&context, v1::GetStatsRequest(), &response);
  if (status.ok()) return response;
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    throw Error(ErrorCode::kUnavailable,
                absl::StrCat("no daemon answers at ", endpoint, ": ", DiagnoseNoConnection(endpoint)));
  }
  throw Error(ToErrorCode(status.error_code()),
              absl::StrCat("stats of ", endpoint, ": ", status.error_message()));
}

void FillSpec(const StreamOptions& o, v1::StreamSpec& spec) {
  spec.set_dataset(o.dataset);
  spec.set_batch_size(o.batch_size);
  spec.set_seed(o.seed);
  spec.set_rank(o.rank);
  spec.set_world_size(o.world_size);
  spec.set_image_size(o.image_size);
  spec.set_augmentation(o.augment == Augment::kEval ? v1::AUGMENTATION_EVAL
                                                    : v1::AUGMENTATION_TRAIN);
  spec.set_dtype(o.dtype == DType::kFloat32 ? v1::DTYPE_FLOAT32 : v1::DTYPE_UINT8);
  spec.set_layout(o.layout == Layout::kNCHW ? v1::LAYOUT_NCHW : v1::LAYOUT_NHWC);
  spec.set_resize(o.resize == Resize::kExact ? v1::RESIZE_EXACT : v1::RESIZE_FAST);
  spec.set_shuffle(o.shuffle);
  spec.set_drop_last(o.drop_last);
  spec.set_end_epoch(o.end_epoch);
  for (float m : o.mean) spec.add_mean(m);
  for (float s : o.std) spec.add_std(s);
  spec.set_ring_slots(o.ring_slots);
}

Connection::Connection(std::string endpoint) : endpoint_(std::move(endpoint)) {
  absl::StatusOr<std::string> target = GrpcTarget(endpoint_);
  if (!target.ok())
    throw Error(ErrorCode::kInvalidArgument, std::string(target.status().message()));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(*target);
  if (!channel.ok()) {
    throw Error(ErrorCode::kInvalidArgument, std::string(channel.status().message()));
  }
  channel_ = *std::move(channel);
  stub_ = v1::Loader::NewStub(channel_);
}

Connection::~Connection() {
  if (InForkedChild()) {
    // Nothing here is ours to touch (see InForkedChild): leak it all, on purpose. The mutexes
    // may even be held by parent threads that do not exist here.
    IgnoreLeak(session_thread_.release());
    IgnoreLeak(stub_.release());
    IgnoreLeak(new std::shared_ptr<grpc::Channel>(std::move(channel_)));
    return;
  }
  std::unique_ptr<std::thread> thread;
  {
    std::lock_guard<std::mutex> lock(session_mu_);
    stopping_ = true;
    if (session_context_ != nullptr) session_context_->TryCancel();
    session_cv_.notify_all();
    thread = std::move(session_thread_);
  }
  if (thread && thread->joinable()) thread->join();
}

void Connection::CheckNotForked() const {
  if (!InForkedChild()) return;
  throw Error(ErrorCode::kFailedPrecondition,
              absl::StrCat("this ringloader Client was created in process ", owner_pid_,
                           " and cannot be used after fork(): open a new Client in the child "
                           "(objects inherited across fork are inert)"));
}

std::string Connection::SessionId(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(session_mu_);
  if (session_thread_ == nullptr && !stopping_) {
    session_thread_ = std::make_unique<std::thread>([this] { SessionLoop(); });
  }
  session_cv_.wait_for(lock, timeout, [this] { return !session_id_.empty() || stopping_; });
  return session_id_;
}

void Connection::SessionRefused(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(session_mu_);
  if (session_id_ == session_id) session_id_.clear();
}

void Connection::SessionLoop() {
  // Between calls the daemon itself ended (it refused us, or it is shutting down): 50 ms, doubled
  // while it keeps refusing, so that a refused client never spins.
  constexpr auto kFirstPause = std::chrono::milliseconds(50);
  constexpr auto kLongestPause = std::chrono::milliseconds(2000);
  auto pause = kFirstPause;
  while (true) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);  // wait out a daemon restart instead of failing fast
    {
      std::lock_guard<std::mutex> lock(session_mu_);
      if (stopping_) return;
      session_context_ = &context;
    }
    v1::AttachRequest request;
    v1::AttachEvent event;
    std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> reader = stub_->Attach(&context, request);
    const bool attached = reader->Read(&event);
    if (attached) {
      {
        std::lock_guard<std::mutex> lock(session_mu_);
        session_id_ = event.session_id();
        session_cv_.notify_all();
      }
      while (reader->Read(&event)) {
      }
    }
    const grpc::Status status = reader->Finish();
    bool stop;
    {
      std::lock_guard<std::mutex> lock(session_mu_);
      session_context_ = nullptr;
      session_id_.clear();
      stop = stopping_;
      // A daemon without Attach (UNIMPLEMENTED) will not grow one: no session, idle timeout.
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) stop = stopping_ = true;
      session_cv_.notify_all();
    }
    if (stop) return;
    if (ConnectionDropped(status)) {
      // The daemon went away (it restarts): attach to the next incarnation as soon as it listens.
      pause = kFirstPause;
      AwaitReconnect();
      continue;
    }
    if (attached) pause = kFirstPause;
    std::unique_lock<std::mutex> lock(session_mu_);
    if (session_cv_.wait_for(lock, pause, [this] { return stopping_; })) return;
    pause = std::min(pause * 2, kLongestPause);
  }
}

bool Connection::ConnectionDropped(const grpc::Status& status) {
  // OK (the daemon shut the session down) and RESOURCE_EXHAUSTED (too many clients) come from a
  // daemon that still listens. Otherwise the connection of a daemon that died leaves READY
  // moments after its calls fail; one that stays READY belongs to a daemon shutting down.
  if (status.ok() || status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) return false;
  const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/false);
  return state != GRPC_CHANNEL_READY ||
         channel_->WaitForStateChange(state, std::chrono::system_clock::now() +
                                                 std::chrono::milliseconds(5));
}

void Connection::AwaitReconnect() {
  // gRPC 1.51 waits at least 100 ms between connection attempts whatever the channel arguments
  // say, which was most of a trainer's wait for a daemon that restarts in ~20 ms. On a Unix socket
  // we look for the new daemon ourselves (a refused non-blocking connect() costs microseconds:
  // every 5 ms for the first quarter second, a restart's usual length, then slower up to every
  // 50 ms) and, once it accepts, tell gRPC to try now (again every 50 ms until it is connected).
  // Other endpoints keep gRPC's pacing.
  constexpr auto kFastPace = std::chrono::milliseconds(5);
  constexpr auto kFastFor = std::chrono::milliseconds(250);
  constexpr auto kMaxPace = std::chrono::milliseconds(50);
  const auto started = std::chrono::steady_clock::now();
  auto pace = kFastPace;
  // Set once the new daemon accepted a probe (from then on gRPC is told to connect).
  std::optional<std::chrono::steady_clock::time_point> last_nudge;
  while (true) {
    const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY || state == GRPC_CHANNEL_SHUTDOWN) return;
    const std::optional<bool> accepts = last_nudge ? true : UnixSocketAccepts(endpoint_);
    if (accepts.has_value() && !*accepts) {
      std::unique_lock<std::mutex> lock(session_mu_);
      if (session_cv_.wait_for(lock, pace, [this] { return stopping_; })) return;
      if (std::chrono::steady_clock::now() - started > kFastFor) pace = std::min(pace * 2, kMaxPace);
      continue;
    }
    if (accepts.has_value()) {  // a Unix socket that accepts: connect now, and every 50 ms
      const auto now = std::chrono::steady_clock::now();
      if (!last_nudge.has_value() || now - *last_nudge >= kMaxPace) {
        grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
        last_nudge = now;
      }
    }
    {
      std::lock_guard<std::mutex> lock(session_mu_);
      if (stopping_) return;
    }
    // Let gRPC's attempt run, looking at stopping_ every 10 ms so ~Connection is not held up.
    channel_->WaitForStateChange(state, std::chrono::system_clock::now() +
                                            std::chrono::milliseconds(10));
  }
}

std::string Connection::DiagnoseNoConnection() const {
  return client::DiagnoseNoConnection(endpoint_);
}

absl::StatusOr<std::shared_ptr<const shm::ConsumerRing>> Connection::MapSegment(
    const std::string& segment, uint64_t incarnation, const std::string& shm_dir) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto key = std::make_pair(incarnation, segment);
  if (auto it = mappings_.find(key); it != mappings_.end()) {
    if (auto ring = it->second.lock()) return ring;
  }
  absl::StatusOr<std::unique_ptr<shm::ConsumerRing>> ring =
      shm::ConsumerRing::Open(segment, incarnation, shm_dir.empty() ? "/dev/shm" : shm_dir);
  if (!ring.ok()) return ring.status();
  std::shared_ptr<const shm::ConsumerRing> shared = *std::move(ring);
  std::erase_if(mappings_, [](const auto& entry) { return entry.second.expired(); });
  mappings_[key] = shared;
  return shared;
}

struct Client::Impl {
  std::shared_ptr<Connection> connection;
};

Client::Client(std::string endpoint)
    : impl_(std::make_unique<Impl>(Impl{std::make_shared<Connection>(std::move(endpoint))})) {}
Client::~Client() = default;

const std::string& Client::endpoint() const { return impl_->connection->endpoint(); }

std::unique_ptr<Stream> Client::Open(const StreamOptions& options) {
  return Open(options, {});
}

std::unique_ptr<Stream> Client::Open(const StreamOptions& options,
                                     const std::function<bool()>& interrupted) {
  impl_->connection->CheckNotForked();
  return OpenStream(impl_->connection, options, interrupted);
}

std::unique_ptr<Stream> Client::Resume(const std::string& state) {
  const ResumeState parsed = ParseState(state);
  if (!parsed.world_cursors.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "Resume: a job's state (CombineStates) names no rank: open each rank with "
                "ContinueState(ParseState(state), options) and that rank's options");
  }
  return Open(ContinueState(parsed, parsed.options).options);
}

}  // namespace ringloader::client
