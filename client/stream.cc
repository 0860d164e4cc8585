// SPDX-License-Identifier: Apache-2.0
// Stream: opening, pulling batches, and surviving the daemon's death (see client.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/channel.h"
#include "client/internal.h"
#include "client/reconnect.h"
#include "client/retry.h"
#include "grpcpp/client_context.h"

namespace ringloader::client {
namespace {

using Clock = std::chrono::steady_clock;

// NextBatch long-polls this long; the call's deadline adds kCallMargin for a busy daemon.
constexpr std::chrono::milliseconds kWait{1000};
constexpr std::chrono::milliseconds kCallMargin{5000};
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

// An OpenStream call in flight. Shared with gRPC's completion callback, which may run after the
// Stream is gone: the call is never left waiting on memory its caller freed.
struct PendingOpen {
  grpc::ClientContext context;
  v1::OpenStreamRequest request;
  v1::OpenStreamResponse response;
  Clock::time_point deadline;  // the attempt's (Reconnect::Started)
  bool sent = false;           // false while waiting for a connection to send it on
  std::mutex mu;
  std::condition_variable cv;  // notified when `done` is set
  bool done = false;
  grpc::Status status;

  void Finish(grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
  // True once the call has ended.
  bool WaitUntil(Clock::time_point until) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_until(lock, until, [this] { return done; });
  }
  // The call's callback holds only a raw pointer: the last reference to `context` (and through it
  // to the grpc::Channel) must never be dropped on gRPC's callback thread. A Channel destroyed
  // there shuts down and frees the very completion queue that thread goes on polling (gRPC 1.51's
  // CallbackAlternativeCQ), an abort in grpc_cq_internal_unref.
  ~PendingOpen() {
    if (!sent) return;
    context.TryCancel();
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return done; });
  }
};

std::chrono::system_clock::time_point SystemTime(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

// A test seam: RINGLOADER_TEST_OPEN_CALLBACK_LINGER_MS keeps gRPC's callback thread in an open's
// callback that long after it has finished, so that the caller is done with everything first.
std::chrono::milliseconds OpenCallbackLinger() {
  const char* value = std::getenv("RINGLOADER_TEST_OPEN_CALLBACK_LINGER_MS");
  return std::chrono::milliseconds(value == nullptr ? 0 : std::atoi(value));
}

uint64_t Nanos(Clock::duration d) {
  return static_cast<uint64_t>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()));
}

std::string OpenId() {
  std::random_device random;
  std::string id(16, '\0');
  for (size_t i = 0; i < id.size(); i += 4) {
    const uint32_t r = random();
    std::memcpy(&id[i], &r, 4);
  }
  return id;
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
        reconnect(o.reconnect_deadline, std::random_device{}()) {}

  // Gets the stream open (Reconnect decides each step; this makes the calls). Returns once it
  // is; throws kDeadlineExceeded at `give_up` with the attempt in flight kept for the next call,
  // kUnavailable past reconnect_deadline, or the error of an open that cannot succeed.
  void EnsureOpen(Clock::time_point give_up) {
    while (true) {
      const auto now = Clock::now();
      const Reconnect::Step step = reconnect.Next(now, give_up);
      switch (step.kind) {
        case Reconnect::Step::kReady:
          if (counting_reconnect) reconnects.fetch_add(1, std::memory_order_relaxed);
          counting_reconnect = false;
          return;
        case Reconnect::Step::kWait:
          Sleep(step.until - now);
          break;
        case Reconnect::Step::kStartOpen:
          StartOpen(now);
          break;
        case Reconnect::Step::kAwaitOpen:
          if (!pending) {  // lost to an exception between its start and its end
            reconnect.Ended(Reconnect::Outcome::kRetry,
                            grpc::Status(grpc::StatusCode::UNAVAILABLE, "open attempt lost"),
                            now);
          } else if (AwaitOpen(step.until)) {
            FinishOpen();
          } else if (Clock::now() >= pending->deadline + Reconnect::kAttemptGrace) {
            // gRPC never ended the call at its deadline: give it up, as a timeout.
            AbandonOpen();
            reconnect.Ended(Reconnect::Outcome::kRetry,
                            grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                         "the daemon did not answer the open in time"),
                            Clock::now());
          }
          break;
        case Reconnect::Step::kGiveUp:
          throw Error(ErrorCode::kDeadlineExceeded,
                      absl::StrCat("no batch in time: reconnecting to ringloaderd at ",
                                   connection->endpoint(), " for ",
                                   absl::StrFormat("%.1f s", std::chrono::duration<double>(
                                                                 now - reconnect.since())
                                                                 .count()),
                                   " (the stream goes on: call Next() again)"));
        case Reconnect::Step::kFail: {
          reconnect.Expired();
          const double waited = std::chrono::duration<double>(now - reconnect.since()).count();
          throw Error(ErrorCode::kUnavailable,
                      absl::StrCat("ringloaderd at ", connection->endpoint(), " unreachable for ",
                                   absl::StrFormat("%.1f s", waited), " (reconnect_deadline ",
                                   Seconds(options.reconnect_deadline),
                                   "): ", DescribeStatus(reconnect.last())));
        }
        case Reconnect::Step::kFailed:
          Throw(reconnect.last());
      }
    }
  }

  // Starts an attempt: the request at `position`, sent once there is a connection (AwaitOpen).
  void StartOpen(Clock::time_point now) {
    if (!connection->connected()) {
      // A socket whose permissions keep us out: said at once, never waited on.
      grpc::Status refused = NoConnectionStatus(connection->endpoint());
      if (refused.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
        reconnect.Started(now);
        reconnect.Ended(Reconnect::Outcome::kFatal, refused, now);
        Throw(refused);
      }
    }
    auto attempt = std::make_shared<PendingOpen>();
    reconnect.Started(now);  // only once `pending` will be set: kOpening always has one
    pending = std::move(attempt);
    pending->deadline = reconnect.attempt_deadline();
    v1::OpenStreamRequest& request = pending->request;
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
    request.set_open_id(OpenId());
  }

  // Sends the pending attempt once connected, then waits for its answer until `until`. True once
  // the attempt has ended (its status is in `pending`).
  // The call waits for the channel to become ready: a synchronous gRPC client only drives a
  // connection's handshake while a call is active, so a fail-fast call followed by a sleep would
  // leave reconnecting to gRPC's 5 s backup poller. Waiting for the connection first (in steps
  // of kInterruptPoll with an `interrupted` hook) lets the hook be polled while nothing is sent.
  bool AwaitOpen(Clock::time_point until) {
    PendingOpen& p = *pending;
    if (!p.sent) {
      while (interrupted && !connection->connected()) {
        CheckInterrupted();
        const auto now = Clock::now();
        if (now >= p.deadline) {
          p.Finish(NoConnectionStatus(connection->endpoint()));
          return true;
        }
        if (now >= until) return false;
        connection->WaitForConnected(SystemTime(std::min({until, p.deadline, now + kInterruptPoll})));
      }
      // The session is attached in the background; waiting for it briefly is enough (without
      // one the stream still works, closed only after the daemon's idle timeout).
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(p.deadline - Clock::now());
      const std::string session = connection->SessionId(
          std::clamp(left, std::chrono::milliseconds(0), std::chrono::milliseconds(2000)));
      p.request.set_session_id(session);
      p.context.set_deadline(SystemTime(p.deadline));
      p.context.set_wait_for_ready(true);
      p.sent = true;
      connection->stub().async()->OpenStream(
          &p.context, &p.request, &p.response,
          [call = pending.get(), linger = OpenCallbackLinger()](grpc::Status status) {
            call->Finish(std::move(status));
            if (linger.count() > 0) std::this_thread::sleep_for(linger);
          });
    }
    while (true) {
      const auto now = Clock::now();
      const auto wait_until = interrupted ? std::min(until, now + kInterruptPoll) : until;
      if (p.WaitUntil(wait_until)) return true;
      CheckInterrupted();
      if (Clock::now() >= until) return false;
    }
  }

  // The attempt in flight has ended: its outcome goes to `reconnect`. Throws the error of an
  // open that cannot succeed.
  void FinishOpen() {
    const std::shared_ptr<PendingOpen> p = std::move(pending);
    grpc::Status status = p->status;
    const auto now = Clock::now();
    const grpc::StatusCode code = status.error_code();
    if (p->sent && (code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                    code == grpc::StatusCode::CANCELLED)) {
      // The daemon may have made the stream after we stopped listening: it goes at once.
      CloseOpen(p->request.open_id());
    }
    if (code == grpc::StatusCode::DEADLINE_EXCEEDED && !connection->connected()) {
      // Waiting for a connection that never came: say why, not "deadline exceeded".
      status = NoConnectionStatus(connection->endpoint());
    }
    if (code == grpc::StatusCode::FAILED_PRECONDITION) {
      const std::string& message = status.error_message();
      if (absl::StartsWith(message, "session_id:")) {
        // Our session ended with the daemon's previous incarnation: attach again and retry.
        connection->SessionRefused(p->request.session_id());
        reconnect.Ended(Reconnect::Outcome::kRetry,
                        grpc::Status(grpc::StatusCode::UNAVAILABLE, message), now);
        return;
      }
      if (absl::StrContains(message, "changed since the position") &&
          options.restart_epoch_if_dataset_changed && fingerprint != 0) {
        position = Position{position.epoch, 0, 0};
        fingerprint = 0;
        progress = EpochProgress{};  // the saved epoch's progress means nothing in the new list
        saved_world = SavedWorld{};
        reconnect.Ended(Reconnect::Outcome::kRestartEpoch, status, now);
        return;
      }
    }
    if (!status.ok()) {
      if (Classify(status.error_code(), status.error_message(), RpcKind::kOpenStream) ==
          Recovery::kFail) {
        reconnect.Ended(Reconnect::Outcome::kFatal, status, now);
        Throw(status);
      }
      reconnect.Ended(Reconnect::Outcome::kRetry, std::move(status), now);
      return;
    }
    try {
      grpc::Status mapped = Opened(p->response);
      reconnect.Ended(mapped.ok() ? Reconnect::Outcome::kOpened : Reconnect::Outcome::kRetry,
                      mapped, now);
    } catch (const Error& e) {
      reconnect.Ended(Reconnect::Outcome::kFatal,
                      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, e.what()), now);
      throw;
    } catch (...) {  // std::bad_alloc and the like: the attempt is over all the same
      reconnect.Ended(Reconnect::Outcome::kFatal,
                      grpc::Status(grpc::StatusCode::INTERNAL, "opening the stream failed"), now);
      throw;
    }
  }

  // The daemon opened the stream: takes its answer and maps the segment. UNAVAILABLE for a
  // vanished segment (retried); other mapping failures throw.
  grpc::Status Opened(const v1::OpenStreamResponse& response) {
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

  // Gives up the attempt in flight, if any: its call is cancelled and the daemon told to close
  // whatever stream it made for it.
  void AbandonOpen() {
    std::shared_ptr<PendingOpen> p = std::move(pending);
    if (p && connection->InForkedChild()) {
      // The call is the parent's: left alone, never freed here (freeing its context would
      // touch gRPC's state in a child, as Connection's destructor explains).
      static auto* const kept = new std::vector<std::shared_ptr<PendingOpen>>();
      kept->push_back(std::move(p));
      return;
    }
    if (!p || !p->sent) return;
    p->context.TryCancel();
    CloseOpen(p->request.open_id());
  }

  // CloseStream(open_id): best effort, as CloseQuietly.
  void CloseOpen(const std::string& open_id) {
    if (connection->InForkedChild()) return;
    v1::CloseStreamRequest request;
    request.set_open_id(open_id);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCloseTimeout);
    v1::CloseStreamResponse response;
    (void)connection->stub().CloseStream(&context, request, &response);
  }

  void CheckInterrupted() {
    if (interrupted && interrupted()) {
      AbandonOpen();
      throw Error(ErrorCode::kCancelled,
                  absl::StrCat("interrupted while opening a stream at ", connection->endpoint()));
    }
  }

  // Sleeps `d`, polling the `interrupted` hook (if any) every kInterruptPoll.
  void Sleep(Clock::duration d) {
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
    reconnect.Lost(grpc::Status(grpc::StatusCode::UNAVAILABLE, "not opened yet"), Clock::now(),
                   /*at_once=*/true);
    EnsureOpen(Clock::time_point::max());
  }

  // The stream was lost at `since`: reopen it at `position` (Next() goes on with it).
  void Lose(grpc::Status why, Clock::time_point since) {
    CloseQuietly();
    counting_reconnect = true;
    reconnect.Lost(std::move(why), since);
  }

  // Tells the daemon we are done with the current stream, if it still listens. In a forked child
  // it only forgets the stream: the stream is the parent's.
  void CloseQuietly() {
    AbandonOpen();
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
    // The trainer's time: its step ended as it called; its wait ends however the call does.
    const auto entered = Clock::now();
    if (last_return) trainer_step_ns.fetch_add(Nanos(entered - *last_return));
    Clock::duration copying{0};
    struct Waited {
      Impl& impl;
      const Clock::time_point& entered;
      const Clock::duration& copying;
      ~Waited() {
        const auto now = Clock::now();
        impl.trainer_wait_ns.fetch_add(Nanos(now - entered - copying));
        impl.trainer_step_ns.fetch_add(Nanos(copying));
        impl.last_return = now;
      }
    } waited{*this, entered, copying};
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
      if (reconnect.state() != Reconnect::State::kOpen) {
        // An earlier Next(timeout) gave up while reconnecting: go on with it (an open in flight
        // is waited for, not sent again). Or an earlier call failed and left the stream closed
        // (kUnavailable past reconnect_deadline, a refused reopen): reconnect, with a new
        // deadline, before anything touches the ring.
        if (reconnect.state() == Reconnect::State::kFailed) {
          Lose(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "the stream was closed by an earlier error"),
               Clock::now());
        }
        EnsureOpen(give_up);
        continue;
      }
      v1::NextBatchRequest request;
      request.set_stream_id(stream_id);
      request.set_incarnation(incarnation);
      request.set_wait_ms(static_cast<uint32_t>(std::max<int64_t>(1, wait.count())));
      request.set_stream_token(token);
      const auto copy_started = Clock::now();
      CopyOutHeldBatches();
      const auto copied = Clock::now();
      copying += copied - copy_started;
      v1::TrainerTime* trainer = request.mutable_trainer();
      trainer->set_wait_ns(trainer_wait_ns.load() + Nanos(copied - entered - copying));
      trainer->set_step_ns(trainer_step_ns.load() + Nanos(copying));
      trainer->set_steps(trainer_steps.load());
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
        Lose(std::move(status), call_started);
        EnsureOpen(give_up);
        continue;
      }
      if (response.end_of_stream()) {
        ended = true;
        break;
      }
      if (response.has_input_bound()) input_bound.store(response.input_bound());
      if (response.has_batch()) {
        trainer_steps.fetch_add(1);
        return Deliver(response.batch());
      }
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
  // The trainer's time (v1::TrainerTime), read from any thread: waiting inside Next(), between
  // calls (with copying held batches out: the trainer's own doing), and the daemon's judgement.
  std::atomic<uint64_t> trainer_wait_ns{0};
  std::atomic<uint64_t> trainer_step_ns{0};
  std::atomic<uint64_t> trainer_steps{0};
  std::atomic<double> input_bound{-1};
  std::optional<Clock::time_point> last_return;  // Next()'s thread only
  // Client::Open's `interrupted` hook, set only while the stream is first opened.
  std::function<bool()> interrupted;
  Reconnect reconnect;  // whether the stream is open, and how it gets back open
  std::shared_ptr<PendingOpen> pending;  // the open attempt in flight (Reconnect::kOpening)
  bool counting_reconnect = false;       // the open in progress replaces a lost stream
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
std::chrono::nanoseconds Stream::trainer_wait() const {
  return std::chrono::nanoseconds(impl_->trainer_wait_ns.load());
}
std::chrono::nanoseconds Stream::trainer_step() const {
  return std::chrono::nanoseconds(impl_->trainer_step_ns.load());
}
double Stream::input_bound() const { return impl_->input_bound.load(); }

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
