// Stream: opening, pulling batches, and surviving the daemon's death (see client.h).
#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/channel.h"
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
// How often an Open with an `interrupted` hook polls it while it waits for the daemon.
constexpr std::chrono::milliseconds kInterruptPoll{200};

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
      : connection(std::move(c)),
        options(o),
        position(o.start),
        progress(o.start_progress),
        progress_epoch(o.start.epoch),
        saved_world(o.saved_world),
        fingerprint(o.dataset_fingerprint),
        backoff(std::random_device{}()) {}

  // One OpenStream at `position` plus mapping its segment. On success the stream is current.
  // A vanished segment comes back as UNAVAILABLE (retried); other mapping failures throw.
  // The call waits for the channel to become ready (up to `timeout`): a synchronous gRPC client
  // only drives a connection's handshake while a call is active, so a fail-fast call followed by
  // a sleep would leave reconnecting to gRPC's 5 s backup poller.
  grpc::Status TryOpen(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::system_clock::now() + timeout;
    if (!connection->connected()) {
      // A socket whose permissions keep us out: said at once, never waited on.
      grpc::Status refused = NoConnectionStatus(connection->endpoint());
      if (refused.error_code() == grpc::StatusCode::PERMISSION_DENIED) return refused;
    }
    if (!AwaitConnection(deadline)) {
      return NoConnectionStatus(connection->endpoint());
    }
    v1::OpenStreamRequest request;
    FillSpec(options, *request.mutable_spec());
    request.mutable_start()->set_epoch(position.epoch);
    request.mutable_start()->set_sequence(position.sequence);
    request.mutable_start()->set_cursor(position.cursor);
    if (position.epoch == progress_epoch) {
      request.mutable_start_progress()->set_prefix(progress.prefix);
      request.mutable_start_progress()->mutable_beyond()->Assign(progress.beyond.begin(),
                                                                 progress.beyond.end());
      if (saved_world.world_size != 0) {
        v1::SavedWorld& world = *request.mutable_saved_world();
        world.set_world_size(saved_world.world_size);
        world.set_drop_last(saved_world.drop_last);
        world.mutable_cursors()->Assign(saved_world.cursors.begin(), saved_world.cursors.end());
      }
    }
    request.set_client_name(options.client_name);
    request.set_expected_fingerprint(fingerprint);
    // The session is attached in the background; waiting for it briefly is enough (without one
    // the stream still works, closed only after the daemon's idle timeout).
    const std::string session =
        connection->SessionId(std::min(timeout, std::chrono::milliseconds(2000)));
    request.set_session_id(session);
    grpc::ClientContext context;
    context.set_deadline(deadline);
    context.set_wait_for_ready(true);
    v1::OpenStreamResponse response;
    grpc::Status status = connection->stub().OpenStream(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !connection->connected()) {
      // Waiting for a connection that never came: say why, not "deadline exceeded".
      return NoConnectionStatus(connection->endpoint());
    }
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      const std::string& message = status.error_message();
      if (absl::StartsWith(message, "session_id:")) {
        // Our session ended with the daemon's previous incarnation: attach again and retry.
        connection->SessionRefused(session);
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, message);
      }
      if (absl::StrContains(message, "changed since the position") &&
          options.restart_epoch_if_dataset_changed && fingerprint != 0) {
        position = Position{position.epoch, 0, 0};
        fingerprint = 0;
        progress = EpochProgress{};  // the saved epoch's progress means nothing in the new list
        saved_world = SavedWorld{};
        return TryOpen(timeout);
      }
    }
    if (!status.ok()) return status;
    stream_id = response.stream_id();
    incarnation = response.incarnation();
    token = response.stream_token();
    fingerprint = response.dataset_fingerprint();
    decoded_images = !response.no_decoded_images();
    dataset_size = response.dataset_size();
    samples_per_epoch = response.samples_per_epoch();
    batches_per_epoch = response.batches_per_epoch();
    open = true;
    const bool resuming =
        position.epoch == progress_epoch && (!progress.empty() || saved_world.world_size != 0);
    if (resuming && !response.start_progress_applied()) {
      CloseQuietly();
      throw Error(ErrorCode::kFailedPrecondition,
                  "the daemon is too old to resume inside an epoch saved at another world size, "
                  "rank or batch size (it ignored the saved progress): upgrade ringloaderd");
    }
    if (position.epoch == progress_epoch) {
      // With a saved world, the daemon's answer is the progress it applied: ours from now on.
      progress.prefix = response.start_progress().prefix();
      progress.beyond.assign(response.start_progress().beyond().begin(),
                             response.start_progress().beyond().end());
      saved_world = SavedWorld{};
    }
    auto mapped =
        connection->MapSegment(response.segment_name(), response.incarnation(), response.shm_dir());
    if (!mapped.ok()) {
      CloseQuietly();  // the daemon must not keep a ring nobody can read
      const std::string where = absl::StrCat(
          response.shm_dir().empty() ? "/dev/shm" : response.shm_dir(), response.segment_name());
      // Not found right after the daemon created it: the daemon died in between (retry), or this
      // process does not see the daemon's shm_dir (a container without the mount: retrying
      // cannot help). Two misses in a row is the latter.
      if (absl::IsNotFound(mapped.status()) && ++missing_segments < 2) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("ring segment vanished: ", mapped.status().message()));
      }
      throw Error(ErrorCode::kFailedPrecondition,
                  absl::StrCat("cannot map the stream's ring ", where, ": ",
                               mapped.status().message(),
                               absl::IsNotFound(mapped.status())
                                   ? "; this process must see the daemon's shm_dir (in a "
                                     "container, mount the same directory the daemon uses)"
                                   : ""));
    }
    missing_segments = 0;
    ring = *std::move(mapped);
    views = std::make_shared<SlotViews>(ring, options.writable_batches
                                                  ? shm::SlotAccess::kCopyOnWrite
                                                  : shm::SlotAccess::kReadOnly);
    return grpc::Status::OK;
  }

  // With an `interrupted` hook: waits for the channel to connect in steps of kInterruptPoll,
  // polling the hook between them (the open call itself then only waits for the daemon's answer).
  // False when `deadline` passed unconnected. Without a hook the call waits for the connection.
  bool AwaitConnection(std::chrono::system_clock::time_point deadline) {
    if (!interrupted) return true;
    while (!connection->connected()) {
      CheckInterrupted();
      const auto now = std::chrono::system_clock::now();
      if (now >= deadline) return false;
      connection->WaitForConnected(std::min(deadline, now + kInterruptPoll));
    }
    return true;
  }

  void CheckInterrupted() {
    if (interrupted && interrupted()) {
      throw Error(ErrorCode::kCancelled,
                  absl::StrCat("interrupted while opening a stream at ", connection->endpoint()));
    }
  }

  // Sleeps `d`, polling the `interrupted` hook (if any) every kInterruptPoll.
  void Sleep(std::chrono::microseconds d) {
    const auto until = Clock::now() + d;
    while (true) {
      CheckInterrupted();
      const auto now = Clock::now();
      if (now >= until) return;
      const Clock::duration left = until - now;
      std::this_thread::sleep_for(interrupted ? std::min<Clock::duration>(left, kInterruptPoll)
                                              : left);
    }
  }

  void OpenFirst() {
    const auto started = Clock::now();
    grpc::Status status = TryOpen(AttemptTimeout(started + options.reconnect_deadline));
    if (status.ok()) return;
    if (Classify(status.error_code(), status.error_message(), RpcKind::kOpenStream) ==
        Recovery::kFail) {
      Throw(status);
    }
    Recover(status, started);
  }

  // How long one attempt may take: what is left of `deadline` (at least a few ms, so that an
  // attempt can succeed at all), at most kOpenTimeout.
  static std::chrono::milliseconds AttemptTimeout(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return std::clamp(left, std::chrono::milliseconds(10), kOpenTimeout);
  }

  // Backs off and reopens at `position` until it works or options.reconnect_deadline has passed
  // since `since` (when the daemon was first found missing): every wait and every attempt is cut
  // to what is left, so the error comes within the deadline plus one backoff step.
  // A caller's `give_up` (Next(timeout)) cuts it short with kDeadlineExceeded: the outage is
  // remembered and the next Next() goes on recovering, its deadline still counted from `since`.
  void Recover(grpc::Status last, Clock::time_point since,
               Clock::time_point give_up = Clock::time_point::max()) {
    CloseQuietly();
    outage.reset();
    const auto deadline = since + options.reconnect_deadline;
    backoff.Reset();
    while (true) {
      const auto now = Clock::now();
      if (now >= give_up && now < deadline) {
        outage = Outage{since, std::move(last)};
        throw Error(ErrorCode::kDeadlineExceeded,
                    absl::StrCat("no batch in time: reconnecting to ringloaderd at ",
                                 connection->endpoint(), " for ",
                                 absl::StrFormat("%.1f s", std::chrono::duration<double>(
                                                               now - since).count()),
                                 " (the stream goes on: call Next() again)"));
      }
      if (now >= deadline) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - since);
        throw Error(ErrorCode::kUnavailable,
                    absl::StrCat("ringloaderd at ", connection->endpoint(), " unreachable for ",
                                 absl::StrFormat("%.1f s", static_cast<double>(waited.count()) / 1000),
                                 " (reconnect_deadline ",
                                 Seconds(options.reconnect_deadline),
                                 "): ", DescribeStatus(last)));
      }
      const auto remaining =
          std::chrono::duration_cast<std::chrono::microseconds>(std::min(deadline, give_up) - now);
      Sleep(std::min(backoff.NextDelay(), remaining));
      if (Clock::now() >= std::min(deadline, give_up)) continue;
      grpc::Status status = TryOpen(std::min(AttemptTimeout(deadline), AttemptTimeout(give_up)));
      if (status.ok()) return;
      if (Classify(status.error_code(), status.error_message(), RpcKind::kOpenStream) ==
          Recovery::kFail) {
        Throw(status);
      }
      last = std::move(status);
    }
  }

  // Tells the daemon we are done with the current stream, if it still listens. In a forked child
  // it only forgets the stream: the stream is the parent's.
  void CloseQuietly() {
    if (!open) return;
    open = false;
    ring.reset();  // our own mapping, in the child too
    views.reset();
    if (connection->InForkedChild()) return;
    v1::CloseStreamRequest request;
    request.set_stream_id(stream_id);
    request.set_incarnation(incarnation);
    request.set_stream_token(token);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCloseTimeout);
    v1::CloseStreamResponse response;
    (void)connection->stub().CloseStream(&context, request, &response);
  }

  // `timeout`: how long to wait for a batch (not counting reconnects); nullopt = for ever.
  std::optional<Batch> Next(std::optional<std::chrono::milliseconds> timeout) {
    connection->CheckNotForked();
    const auto give_up = timeout ? Clock::now() + *timeout : Clock::time_point::max();
    // One thread at a time: a second caller would reopen the stream under the first one.
    if (in_next.exchange(true)) {
      throw Error(ErrorCode::kFailedPrecondition,
                  "a Stream is used by one thread at a time: Next() was called while another "
                  "thread's Next() on the same Stream was running (use one Stream per thread)");
    }
    struct Leave {
      std::atomic<bool>& flag;
      ~Leave() { flag.store(false); }
    } leave{in_next};
    while (!ended) {
      auto wait = kWait;
      if (timeout) {
        // Rounded up: a truncated 0.7 ms would give up before the caller's timeout has passed.
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(give_up - Clock::now());
        if (left.count() <= 0) {
          throw Error(ErrorCode::kDeadlineExceeded,
                      absl::StrCat("no batch within ", timeout->count(),
                                   " ms (the stream goes on: call Next() again)"));
        }
        wait = std::min(wait, left);
      }
      if (outage || !open) {
        // An earlier Next(timeout) gave up while reconnecting: go on with it. Or an earlier call
        // failed and left the stream closed (kUnavailable past reconnect_deadline, a refused
        // reopen): reconnect, with a new deadline, before anything touches the ring.
        Outage o = outage ? *std::move(outage)
                          : Outage{Clock::now(),
                                   grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                "the stream was closed by an earlier error")};
        Recover(std::move(o.last), o.since, give_up);
        reconnects.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      v1::NextBatchRequest request;
      request.set_stream_id(stream_id);
      request.set_incarnation(incarnation);
      request.set_wait_ms(static_cast<uint32_t>(std::max<int64_t>(1, wait.count())));
      request.set_stream_token(token);
      CopyOutHeldBatches();
      for (const PendingRelease& r : releases->Drain()) {
        // Handles of an earlier stream or incarnation died with it: never send them.
        if (r.stream_id != stream_id || r.incarnation != incarnation) continue;
        v1::Release* release = request.add_releases();
        release->set_slot(r.slot);
        release->set_ring_sequence(r.ring_sequence);
        release->set_copied_out(r.copied_out);
      }
      grpc::ClientContext context;
      const auto call_started = Clock::now();
      // A hung daemon is noticed within reconnect_deadline, not after a whole wait plus margin.
      context.set_deadline(std::chrono::system_clock::now() +
                           std::min<std::chrono::milliseconds>(
                               kWait + kCallMargin,
                               std::max<std::chrono::milliseconds>(
                                   kWait + std::chrono::milliseconds(100),
                                   std::chrono::duration_cast<std::chrono::milliseconds>(
                                       options.reconnect_deadline))));
      v1::NextBatchResponse response;
      grpc::Status status = connection->stub().NextBatch(&context, request, &response);
      if (!status.ok()) {
        if (Classify(status.error_code(), status.error_message(), RpcKind::kStreamCall) ==
            Recovery::kFail) {
          Throw(status);
        }
        // The outage began no later than this call: the deadline counts from its start (a call
        // that hung for seconds has used those seconds).
        Recover(std::move(status), call_started, give_up);
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

  // Keeps at most MaxHeldInRing() of this stream's delivered batches in the ring, copying the
  // oldest of the others out (see client/held_batches.h). Their releases go with the next request.
  void CopyOutHeldBatches() {
    std::vector<std::shared_ptr<HeldBatch>> in_ring;
    for (auto it = held.begin(); it != held.end();) {
      std::shared_ptr<HeldBatch> h = it->lock();
      // Batches of an earlier stream or incarnation hold no slot of this ring.
      if (!h || !h->in_ring() || h->lease().stream_id != stream_id ||
          h->lease().incarnation != incarnation) {
        it = held.erase(it);
        continue;
      }
      in_ring.push_back(std::move(h));
      ++it;
    }
    const size_t keep = MaxHeldInRing(ring->slot_count());
    for (size_t i = 0; i + keep < in_ring.size(); ++i) {
      absl::StatusOr<bool> copied = in_ring[i]->CopyOut();
      if (!copied.ok()) {
        throw Error(ErrorCode::kResourceExhausted,
                    absl::StrCat("cannot copy a held batch out of the ring to free its slot (",
                                 copied.status().message(), "); release batches you keep"));
      }
    }
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
    // Every refusal below gives the slot straight back.
    shm::SlotMapping view;
    auto refuse = [&](ErrorCode code, std::string message) -> Error {
      if (view.data() != nullptr) views->Give(lease.slot, std::move(view));
      releases->Push(lease);
      return Error(code, std::move(message));
    };
    if (handle.slot() >= ring->slot_count()) {
      throw refuse(ErrorCode::kInternal,
                   absl::StrCat("daemon sent an invalid batch handle: slot ", handle.slot(),
                                " >= slot_count ", ring->slot_count()));
    }
    absl::StatusOr<shm::SlotMapping> taken = views->Take(handle.slot());
    if (!taken.ok()) {
      throw refuse(ErrorCode::kResourceExhausted,
                   absl::StrCat("cannot map a ring slot: ", taken.status().message()));
    }
    view = *std::move(taken);
    auto impl = MakeBatchImpl(handle, options, decoded_images, ring->slot_count(),
                              view.bytes());
    if (!impl.ok()) throw refuse(ErrorCode::kInternal, std::string(impl.status().message()));
    // Batches come in order with no gap: exactly the position we asked for, or the next epoch's
    // first batch when the rest of this epoch yielded none (a dropped or all-bad tail). Anything
    // else means batches went elsewhere: fail loudly rather than train on a hole.
    const Position& at = (*impl)->position;
    // (A resumed epoch's rest may yield nothing at all.)
    const bool resumed = position.epoch == progress_epoch && !progress.empty();
    const bool expected = at == position || (at.epoch == position.epoch + 1 && at.sequence == 0 &&
                                             at.cursor == 0 && (position.sequence > 0 || resumed));
    if (!expected) {
      throw refuse(ErrorCode::kDataLoss,
                   absl::StrCat("batch gap: expected epoch ", position.epoch, " sequence ",
                                position.sequence, " cursor ", position.cursor,
                                ", the daemon sent epoch ", at.epoch, " sequence ", at.sequence,
                                " cursor ", at.cursor));
    }
    if (options.verify_checksums) {
      absl::Status verified = ring->Verify(handle.slot(), handle.ring_sequence(), view.bytes());
      if (verified.ok() && ring->Slot(handle.slot()).checksum != handle.payload_checksum()) {
        verified = absl::DataLossError(
            absl::StrCat("slot ", handle.slot(), ": handle checksum ", handle.payload_checksum(),
                         " != descriptor checksum ", ring->Slot(handle.slot()).checksum));
      }
      if (!verified.ok()) {
        throw refuse(ErrorCode::kDataLoss,
                     absl::StrCat("batch checksum mismatch: ", verified.message()));
      }
    }
    position = (*impl)->next;
    // From here on the Batch returns its slot when destroyed.
    auto claim = std::make_shared<HeldBatch>(std::move(view), views, releases, lease,
                                             (*impl)->used_bytes);
    held.push_back(claim);
    (*impl)->held = std::move(claim);
    return Batch(*std::move(impl));
  }

  const std::shared_ptr<Connection> connection;
  const StreamOptions options;
  Position position;  // of the next batch to deliver; owned by the client
  // The progress epoch `progress_epoch` continues after (client.h "Elastic restarts"), and the
  // saved world to send until an open has applied it.
  EpochProgress progress;
  const uint64_t progress_epoch;
  SavedWorld saved_world;
  uint64_t fingerprint = 0;  // of the dataset; 0 until the first open unless resuming
  bool decoded_images = true;  // false for an arrays dataset (OpenStreamResponse)
  uint64_t stream_id = 0;
  uint64_t incarnation = 0;
  std::string token;         // OpenStreamResponse.stream_token of the current stream
  int missing_segments = 0;  // consecutive opens whose segment was not found
  bool open = false;
  bool ended = false;
  std::shared_ptr<const shm::ConsumerRing> ring;
  std::shared_ptr<SlotViews> views;  // of `ring`
  const std::shared_ptr<ReleaseQueue> releases = std::make_shared<ReleaseQueue>();
  std::deque<std::weak_ptr<HeldBatch>> held;  // delivered batches of this stream, oldest first
  uint64_t dataset_size = 0, samples_per_epoch = 0, batches_per_epoch = 0;  // of the last open
  std::atomic<uint64_t> reconnects{0};
  std::atomic<bool> in_next{false};
  // Client::Open's `interrupted` hook, set only while the stream is first opened.
  std::function<bool()> interrupted;
  Backoff backoff;
  // A reconnect that a Next(timeout) left unfinished: when the daemon went missing, and why.
  struct Outage {
    Clock::time_point since;
    grpc::Status last;
  };
  std::optional<Outage> outage;
};

Stream::Stream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Stream::~Stream() {
  if (impl_) impl_->CloseQuietly();
}
std::optional<Batch> Stream::Next() { return impl_->Next(std::nullopt); }
std::optional<Batch> Stream::Next(std::chrono::milliseconds timeout) {
  return impl_->Next(timeout);
}
Position Stream::position() const { return impl_->position; }
std::string Stream::State() const {
  StreamOptions options = impl_->options;
  options.dataset_fingerprint = impl_->fingerprint;
  options.start_progress =
      impl_->position.epoch == impl_->progress_epoch ? impl_->progress : EpochProgress{};
  return FormatState(options, impl_->position);
}
uint64_t Stream::dataset_fingerprint() const { return impl_->fingerprint; }
EpochProgress Stream::start_progress() const { return impl_->progress; }
uint64_t Stream::dataset_size() const { return impl_->dataset_size; }
uint64_t Stream::samples_per_epoch() const { return impl_->samples_per_epoch; }
uint64_t Stream::batches_per_epoch() const { return impl_->batches_per_epoch; }
const StreamOptions& Stream::options() const { return impl_->options; }
uint64_t Stream::reconnects() const { return impl_->reconnects.load(std::memory_order_relaxed); }
uint64_t Stream::copies() const { return impl_->releases->copied_out(); }

std::unique_ptr<Stream> OpenStream(std::shared_ptr<Connection> connection,
                                   const StreamOptions& options,
                                   const std::function<bool()>& interrupted) {
  ValidateOptions(options);
  auto impl = std::make_unique<Stream::Impl>(std::move(connection), options);
  impl->interrupted = interrupted;
  impl->OpenFirst();
  impl->interrupted = nullptr;
  return std::make_unique<Stream>(std::move(impl));
}

}  // namespace ringloader::client
