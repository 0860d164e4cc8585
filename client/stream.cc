// Stream: opening, pulling batches, and surviving the daemon's death (see client.h).
#include <atomic>
#include <chrono>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/internal.h"
#include "client/retry.h"
#include "grpcpp/client_context.h"

namespace ringloader::client {
namespace {

using Clock = std::chrono::steady_clock;

// NextBatch long-polls this long; the call's deadline adds kCallMargin for a busy daemon.
constexpr std::chrono::milliseconds kWait{1000};
constexpr std::chrono::milliseconds kCallMargin{5000};
// An OpenStream may make the daemon map a new ring and (first use) index a dataset.
constexpr std::chrono::milliseconds kOpenTimeout{30'000};
// Closing is best effort (the daemon reclaims abandoned streams after its lease timeout).
constexpr std::chrono::milliseconds kCloseTimeout{500};

std::string Seconds(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return absl::StrCat(d.count() / 1000, " s");
  return absl::StrFormat("%.3g s", static_cast<double>(d.count()) / 1000.0);
}

[[noreturn]] void Throw(const grpc::Status& status) {
  throw Error(ToErrorCode(status.error_code()),
              status.error_message().empty() ? DescribeStatus(status) : status.error_message());
}

}  // namespace

struct Stream::Impl {
  Impl(std::shared_ptr<Connection> c, const StreamOptions& o)
      : connection(std::move(c)), options(o), position(o.start), backoff(std::random_device{}()) {}

  // One OpenStream at `position` plus mapping its segment. On success the stream is current.
  // A vanished segment comes back as UNAVAILABLE (retried); other mapping failures throw.
  // The call waits for the channel to become ready (up to `timeout`): a synchronous gRPC client
  // only drives a connection's handshake while a call is active, so a fail-fast call followed by
  // a sleep would leave reconnecting to gRPC's 5 s backup poller.
  grpc::Status TryOpen(std::chrono::milliseconds timeout) {
    v1::OpenStreamRequest request;
    FillSpec(options, *request.mutable_spec());
    request.mutable_start()->set_epoch(position.epoch);
    request.mutable_start()->set_sequence(position.sequence);
    request.mutable_start()->set_cursor(position.cursor);
    request.set_client_name(options.client_name);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout);
    context.set_wait_for_ready(true);
    v1::OpenStreamResponse response;
    grpc::Status status = connection->stub().OpenStream(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !connection->connected()) {
      // Waiting for a connection that never came: say that, not "deadline exceeded".
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "no connection (is ringloaderd running and the endpoint right?)");
    }
    if (!status.ok()) return status;
    auto mapped = connection->MapSegment(response.segment_name(), response.incarnation());
    if (!mapped.ok()) {
      if (absl::IsNotFound(mapped.status())) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("ring segment vanished: ", mapped.status().message()));
      }
      throw Error(ErrorCode::kFailedPrecondition,
                  absl::StrCat("cannot map the stream's ring: ", mapped.status().message()));
    }
    ring = *std::move(mapped);
    stream_id = response.stream_id();
    incarnation = response.incarnation();
    open = true;
    return grpc::Status::OK;
  }

  void OpenFirst() {
    grpc::Status status = TryOpen(std::clamp(
        std::chrono::duration_cast<std::chrono::milliseconds>(options.reconnect_deadline),
        std::chrono::milliseconds(100), kOpenTimeout));
    if (status.ok()) return;
    if (Classify(status.error_code(), status.error_message(), RpcKind::kOpenStream) ==
        Recovery::kFail) {
      Throw(status);
    }
    Recover(status);
  }

  // Backs off and reopens at `position` until it works or options.reconnect_deadline passes.
  void Recover(grpc::Status last) {
    CloseQuietly();
    const auto deadline = Clock::now() + options.reconnect_deadline;
    backoff.Reset();
    while (true) {
      const auto now = Clock::now();
      if (now >= deadline) {
        throw Error(ErrorCode::kUnavailable,
                    absl::StrCat("ringloaderd at ", connection->endpoint(), " unreachable for ",
                                 Seconds(options.reconnect_deadline), ": ", DescribeStatus(last)));
      }
      const auto remaining = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      std::this_thread::sleep_for(std::min(backoff.NextDelay(), remaining));
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      grpc::Status status = TryOpen(std::clamp(left, std::chrono::milliseconds(100), kOpenTimeout));
      if (status.ok()) return;
      if (Classify(status.error_code(), status.error_message(), RpcKind::kOpenStream) ==
          Recovery::kFail) {
        Throw(status);
      }
      last = std::move(status);
    }
  }

  // Tells the daemon we are done with the current stream, if it still listens.
  void CloseQuietly() {
    if (!open) return;
    open = false;
    ring.reset();
    v1::CloseStreamRequest request;
    request.set_stream_id(stream_id);
    request.set_incarnation(incarnation);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCloseTimeout);
    v1::CloseStreamResponse response;
    (void)connection->stub().CloseStream(&context, request, &response);
  }

  std::optional<Batch> Next() {
    while (!ended) {
      v1::NextBatchRequest request;
      request.set_stream_id(stream_id);
      request.set_incarnation(incarnation);
      request.set_wait_ms(static_cast<uint32_t>(kWait.count()));
      for (const PendingRelease& r : releases->Drain()) {
        // Handles of an earlier stream or incarnation died with it: never send them.
        if (r.stream_id != stream_id || r.incarnation != incarnation) continue;
        v1::Release* release = request.add_releases();
        release->set_slot(r.slot);
        release->set_ring_sequence(r.ring_sequence);
      }
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + kWait + kCallMargin);
      v1::NextBatchResponse response;
      grpc::Status status = connection->stub().NextBatch(&context, request, &response);
      if (!status.ok()) {
        if (Classify(status.error_code(), status.error_message(), RpcKind::kStreamCall) ==
            Recovery::kFail) {
          Throw(status);
        }
        Recover(std::move(status));
        reconnects.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (response.end_of_stream()) {
        ended = true;
        break;
      }
      if (response.has_batch()) return Deliver(response.batch());
      // pending: nothing ready within wait_ms; ask again.
    }
    return std::nullopt;
  }

  Batch Deliver(const v1::BatchHandle& handle) {
    if (handle.stream_id() != stream_id || handle.incarnation() != incarnation) {
      throw Error(ErrorCode::kInternal,
                  absl::StrCat("daemon sent a handle of stream ", handle.stream_id(),
                               " incarnation ", handle.incarnation(), " to stream ", stream_id,
                               " incarnation ", incarnation));
    }
    const PendingRelease lease{handle.stream_id(), handle.incarnation(), handle.slot(),
                               handle.ring_sequence()};
    auto impl = MakeBatchImpl(handle, options, ring);
    if (!impl.ok()) {
      releases->Push(lease);
      throw Error(ErrorCode::kInternal, std::string(impl.status().message()));
    }
    const Position& at = (*impl)->position;
    if (at.epoch < position.epoch ||
        (at.epoch == position.epoch && at.sequence < position.sequence)) {
      releases->Push(lease);
      throw Error(ErrorCode::kInternal,
                  absl::StrCat("daemon sent batch (epoch ", at.epoch, ", sequence ", at.sequence,
                               ") before the requested position (epoch ", position.epoch,
                               ", sequence ", position.sequence, ")"));
    }
    if (options.verify_checksums) {
      absl::Status verified = ring->Verify(handle.slot(), handle.ring_sequence());
      if (verified.ok() && ring->Slot(handle.slot()).checksum != handle.payload_checksum()) {
        verified = absl::DataLossError(
            absl::StrCat("slot ", handle.slot(), ": handle checksum ", handle.payload_checksum(),
                         " != descriptor checksum ", ring->Slot(handle.slot()).checksum));
      }
      if (!verified.ok()) {
        releases->Push(lease);
        throw Error(ErrorCode::kDataLoss,
                    absl::StrCat("batch checksum mismatch: ", verified.message()));
      }
    }
    position = (*impl)->next;
    (*impl)->releases = releases;  // from here on the Batch returns its slot when destroyed
    return Batch(*std::move(impl));
  }

  const std::shared_ptr<Connection> connection;
  const StreamOptions options;
  Position position;  // of the next batch to deliver; owned by the client
  uint64_t stream_id = 0;
  uint64_t incarnation = 0;
  bool open = false;
  bool ended = false;
  std::shared_ptr<const shm::ConsumerRing> ring;
  const std::shared_ptr<ReleaseQueue> releases = std::make_shared<ReleaseQueue>();
  std::atomic<uint64_t> reconnects{0};
  Backoff backoff;
};

Stream::Stream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Stream::~Stream() {
  if (impl_) impl_->CloseQuietly();
}
std::optional<Batch> Stream::Next() { return impl_->Next(); }
Position Stream::position() const { return impl_->position; }
std::string Stream::State() const { return FormatState(impl_->options, impl_->position); }
const StreamOptions& Stream::options() const { return impl_->options; }
uint64_t Stream::reconnects() const { return impl_->reconnects.load(std::memory_order_relaxed); }

std::unique_ptr<Stream> OpenStream(std::shared_ptr<Connection> connection,
                                   const StreamOptions& options) {
  ValidateOptions(options);
  auto impl = std::make_unique<Stream::Impl>(std::move(connection), options);
  impl->OpenFirst();
  return std::make_unique<Stream>(std::move(impl));
}

}  // namespace ringloader::client
