// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/stream_manager.h"

#include <sys/resource.h>

#include <grp.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proto/resume_limits.h"
#include "proto/wire_text.h"
#include "server/pipeline/sampler.h"
#include "server/daemon/feeder_pool.h"
#include "server/daemon/heap.h"
#include "server/daemon/resume_position.h"
#include "server/daemon/tls_server.h"
#include "server/daemon/status_text.h"
#include "spdlog/spdlog.h"
#include "shm/base/text.h"
#include "shm/base/clock.h"

namespace ringloader::server {
namespace {

// A client-supplied name for a message or log line: escaped, and at most 64 bytes of it (the
// whole would be echoed whatever its size).
std::string Shortened(const std::string& name) {
  std::string text = wire::EscapeBytes(name.substr(0, 64));
  if (name.size() > 64) absl::StrAppend(&text, "... (", name.size(), " bytes)");
  return text;
}
// How long an Open waits for room under max_streams before refusing (see Open).
constexpr auto kWaitForRoom = std::chrono::seconds(2);
// Open ids a client gave up on before their open was seen (stream_manager.h): kept this long,
// at most this many.
constexpr auto kLostOpenMemory = std::chrono::seconds(60);
constexpr size_t kMaxLostOpens = 4096;

void ToProto(const QuarantineEntry& e, v1::QuarantinedSample* q) {
  q->set_dataset(e.dataset);
  q->set_sample_index(e.sample_index);
  q->set_path(e.path);  // stored escaped (ApplyStrikes)
  q->set_strikes(e.strikes);
}

// " after N consumed (from world W)" for a stream that continues a resumed epoch, else "".
std::string ResumedText(const pipeline::EpochProgress& progress,
                        const v1::OpenStreamRequest& request) {
  if (progress.consumed() == 0) return "";
  std::string text = absl::StrCat(" after ", progress.consumed(), " consumed");
  if (request.saved_world().world_size() != 0) {
    absl::StrAppend(&text, " (resized from world ", request.saved_world().world_size(), ")");
  }
  return text;
}

// `n` bytes from the kernel's CSPRNG (tokens and session ids must not be guessable).
std::string RandomBytes(size_t n) {
  std::string bytes(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(bytes.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      SPDLOG_CRITICAL("getrandom: {}", std::strerror(errno));
      std::abort();  // no randomness at all: nothing here can be trusted
    }
    got += static_cast<size_t>(r);
  }
  return bytes;
}

// Constant-time comparison, so a token cannot be guessed byte by byte from response times.
bool SameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::optional<gid_t> LookupGroup(const std::string& name) {
  if (name.empty()) return std::nullopt;
  struct group* g = getgrnam(name.c_str());
  if (g == nullptr) return std::nullopt;
  return g->gr_gid;
}

}  // namespace

image::TransformSpec ToTransform(const v1::StreamSpec& spec) {
  image::TransformSpec t;
  t.image_size = spec.image_size();
  t.augment = spec.augmentation() == v1::AUGMENTATION_EVAL ? image::Augment::kEval
                                                            : image::Augment::kTrain;
  t.dtype = spec.dtype() == v1::DTYPE_FLOAT32 ? image::DType::kFloat32 : image::DType::kUint8;
  t.layout = spec.layout() == v1::LAYOUT_NCHW ? image::Layout::kNCHW : image::Layout::kNHWC;
  t.exact_resize = spec.resize() == v1::RESIZE_EXACT;
  if (spec.mean_size() == 3) {
    for (int c = 0; c < 3; ++c) t.mean[c] = spec.mean(c);
  }
  if (spec.std_size() == 3) {
    for (int c = 0; c < 3; ++c) t.std[c] = spec.std(c);
  }
  return t;
}

StreamManager::StreamManager(StreamManagerDeps deps) : deps_(deps) {}

StreamManager::~StreamManager() { Shutdown(); }

absl::Status StreamManager::Reject(absl::Status status) {
  deps_.stats->requests_rejected.fetch_add(1, std::memory_order_relaxed);
  SPDLOG_DEBUG("request rejected: {}", status.ToString());
  return status;
}

absl::Status StreamManager::Validate(const v1::StreamSpec& spec) const {
  return ValidateStreamSpec(deps_.config->server, spec);
}

absl::Status ValidateStreamSpec(const ServerConfig& s, const v1::StreamSpec& spec) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (spec.batch_size() == 0 || spec.batch_size() > s.max_batch_size) {
    return invalid("batch_size: must be in [1, server.max_batch_size = ", s.max_batch_size,
                   "] (got ", spec.batch_size(), ")");
  }
  if (spec.image_size() == 0 || spec.image_size() > s.max_image_size) {
    return invalid("image_size: must be in [1, server.max_image_size = ", s.max_image_size,
                   "] (got ", spec.image_size(), ")");
  }
  if (spec.world_size() > wire::kMaxWorldSize) {
    return invalid("world_size: must be in [1, ", wire::kMaxWorldSize, "] (got ",
                   spec.world_size(), ")");
  }
  if (spec.rank() >= spec.world_size()) {
    return invalid("rank: must be < world_size (got rank ", spec.rank(), ", world_size ",
                   spec.world_size(), ")");
  }
  if (!v1::Augmentation_IsValid(spec.augmentation())) {
    return invalid("augmentation: unknown value ", spec.augmentation());
  }
  if (spec.dtype() != v1::DTYPE_UNSPECIFIED && spec.dtype() != v1::DTYPE_UINT8 &&
      spec.dtype() != v1::DTYPE_FLOAT32) {
    return invalid("dtype: images can be UINT8 or FLOAT32 (got ", spec.dtype(), ")");
  }
  if (!v1::Layout_IsValid(spec.layout())) return invalid("layout: unknown value ", spec.layout());
  if (!v1::Resize_IsValid(spec.resize())) return invalid("resize: unknown value ", spec.resize());
  if (spec.dtype() != v1::DTYPE_FLOAT32 && (spec.mean_size() != 0 || spec.std_size() != 0)) {
    return invalid("mean/std: only valid with dtype FLOAT32");
  }
  if ((spec.mean_size() != 0 && spec.mean_size() != 3) ||
      (spec.std_size() != 0 && spec.std_size() != 3)) {
    return invalid("mean/std: need exactly 3 values each (got ", spec.mean_size(), " and ",
                   spec.std_size(), ")");
  }
  for (float v : spec.std()) {
    // Far enough from 0 that (x - mean) / std stays finite (the client checks the same bounds).
    if (!(v >= 1e-6f && v <= 1e6f)) return invalid("std: values must be in [1e-06, 1e+06] (got ", v, ")");
  }
  for (float v : spec.mean()) {
    if (!(v > -1e6f && v < 1e6f)) return invalid("mean: values must be finite (got ", v, ")");
  }
  if (spec.ring_slots() != 0 && (spec.ring_slots() < 2 || spec.ring_slots() > s.max_ring_slots)) {
    return invalid("ring_slots: must be 0 (the server's default) or in [2, server.max_ring_slots = ",
                   s.max_ring_slots, "] (got ", spec.ring_slots(), ")");
  }
  return absl::OkStatus();
}

std::string ClientKeyOfPeer(const std::string& peer) {
  const bool v4 = peer.rfind("ipv4:", 0) == 0;
  const bool v6 = peer.rfind("ipv6:", 0) == 0;
  if (!v4 && !v6) return "";
  const size_t colon = peer.rfind(':');
  if (colon <= 5) return peer;  // no port
  if (v6 && peer[colon - 1] != ']') return peer;
  return peer.substr(0, colon);
}

void StreamManager::SetStarting(std::string progress) {
  std::lock_guard<std::mutex> lock(mu_);
  starting_ = true;
  starting_progress_ = std::move(progress);
}

void StreamManager::MarkReady() {
  std::lock_guard<std::mutex> lock(mu_);
  starting_ = false;
  starting_progress_.clear();
}

bool StreamManager::starting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return starting_;
}

std::string StreamManager::starting_progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return starting_progress_;
}

absl::Status StreamManager::Open(const v1::OpenStreamRequest& request,
                                 v1::OpenStreamResponse* response, const std::string& peer,
                                 const std::function<bool()>& cancelled) {
  const std::string& open_id = request.open_id();
  if (!open_id.empty() && open_id.size() != kOpenIdBytes) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(
        "open_id: must be empty or ", kOpenIdBytes, " bytes (got ", open_id.size(), ")")));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (starting_) {
      return absl::UnavailableError(
          absl::StrCat("ringloaderd is starting: ", starting_progress_, " (retry)"));
    }
    if (TakeLostOpen(open_id)) return GaveUp(open_id);
  }
  v1::StreamSpec spec = request.spec();
  if (spec.world_size() == 0) spec.set_world_size(1);
  const ServedDataset* served = deps_.datasets->Find(spec.dataset());
  if (served == nullptr && deps_.datasets->Indexing(spec.dataset())) {
    // Served without it: its storage is slow or does not answer. Clients retry UNAVAILABLE.
    return Reject(absl::UnavailableError(absl::StrCat(
        "dataset \"", Shortened(spec.dataset()),
        "\" is still being indexed (its storage is slow or does not answer); the stream opens "
        "once it is")));
  }
  if (served == nullptr) {
    return Reject(absl::NotFoundError(
        absl::StrCat("unknown dataset \"", Shortened(spec.dataset()), "\"; configured: ",
                     absl::StrJoin(deps_.datasets->Names(), ", "))));
  }
  if (absl::Status s = Validate(spec); !s.ok()) return Reject(s);
  const pipeline::Dataset& dataset = *served->dataset;
  const DatasetConfig& dataset_config = served->config;
  if (request.expected_fingerprint() != 0 &&
      request.expected_fingerprint() != dataset.fingerprint()) {
    return Reject(absl::FailedPreconditionError(absl::StrFormat(
        "dataset \"%s\" changed since the position being resumed was saved (fingerprint "
        "%016x then, %016x now): files were added, removed or renamed, so resuming at that "
        "position would repeat or skip samples; start the epoch again instead",
        spec.dataset(), request.expected_fingerprint(), dataset.fingerprint())));
  }
  const uint64_t shard_size =
      pipeline::EpochShard::ShardSize(dataset.size(), spec.world_size(), spec.drop_last());
  // A mistaken world size or batch size must not train on nothing, silently.
  if (shard_size == 0 || (spec.drop_last() && shard_size < spec.batch_size())) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(
        "rank ", spec.rank(), " of world_size ", spec.world_size(), " gets ", shard_size,
        " of the ", dataset.size(), " samples of dataset \"", spec.dataset(), "\": ",
        shard_size == 0 ? "no batch at all"
                        : absl::StrCat("with drop_last, no full batch of batch_size ",
                                       spec.batch_size()),
        " (lower batch_size or world_size", spec.drop_last() ? ", or turn drop_last off" : "",
        ")")));
  }
  absl::StatusOr<pipeline::EpochProgress> start_progress =
      StartProgressOf(request, spec, dataset.size());
  if (!start_progress.ok()) return Reject(start_progress.status());

  StreamSetup setup;
  setup.incarnation = deps_.incarnation;
  setup.client_name = request.client_name().substr(0, 128);
  setup.client_key = ClientKeyOfPeer(peer);
  setup.token = RandomBytes(16);
  setup.spec = spec;
  setup.dataset = &dataset;
  setup.on_error = dataset_config.on_error;
  setup.limits = DecodeLimitsOf(dataset_config);
  setup.transform = ToTransform(spec);
  if (dataset_config.cache_memory && setup.transform.augment == image::Augment::kEval &&
      deps_.cache != nullptr) {
    // Everything the bytes of an eval sample depend on, besides the file.
    const image::TransformSpec& t = setup.transform;
    setup.cache_key = absl::StrFormat(
        "%s|%u|%d|%d|%d|%a,%a,%a|%a,%a,%a", dataset_config.name, t.image_size,
        static_cast<int>(t.dtype), static_cast<int>(t.layout), t.exact_resize ? 1 : 0,
        t.mean[0], t.mean[1], t.mean[2], t.std[0], t.std[1], t.std[2]);
  }
  setup.layout = pipeline::ComputeBatchLayout(spec.batch_size(), setup.transform, &dataset);
  setup.start = request.start();
  setup.start_progress = *std::move(start_progress);

  // Ring + one epoch's shard order (4 bytes a sample) + the resumed progress's beyond list
  // (bounded by wire::kMaxBeyondPositions), reserved before the ring is made.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t slot_bytes = (setup.layout.total_bytes + page - 1) / page * page;
  if (spec.ring_slots() == 0) spec.set_ring_slots(deps_.config->server.DefaultRingSlots(slot_bytes));
  setup.spec.set_ring_slots(spec.ring_slots());
  const uint64_t ring_bytes = spec.ring_slots() * slot_bytes + 64 * 1024;
  // A trainer restarted at once after a crash may ask before the daemon has acted on its
  // predecessor's death (the session's end, noticed within a poll): at max_streams, or with
  // memory_limit held by the dead trainer's ring, it waits briefly for a stream to go rather
  // than be refused a restart that is about to fit.
  const auto give_up = std::chrono::steady_clock::now() + kWaitForRoom;
  absl::StatusOr<Reservation> reservation;
  while (true) {
    const uint64_t left_before = WaitForRoom(setup.client_key, give_up);
    reservation = deps_.budget->Reserve(
        ring_bytes + shard_size * 4 + setup.start_progress.beyond.size() * sizeof(uint64_t),
        absl::StrCat("a stream of dataset \"", spec.dataset(), "\" (ring of ", spec.ring_slots(),
                     " slots x ", base::FormatBytes(slot_bytes), ")"));
    if (reservation.ok() || !absl::IsResourceExhausted(reservation.status()) ||
        !WaitForStreamToLeave(left_before, give_up)) {
      break;
    }
  }
  if (!reservation.ok()) return Reject(reservation.status());
  // The ring is the costly part (a 462 MB ring takes ~0.4 s to allocate and populate): never
  // for a client that has stopped waiting.
  if (cancelled && cancelled()) return GaveUp(open_id);

  // Streams being opened count against the limits too, so concurrent opens cannot exceed them.
  uint64_t id;
  const std::string client_key = setup.client_key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return absl::UnavailableError("ringloaderd is shutting down");
    if (!request.session_id().empty()) {
      if (sessions_.count(request.session_id()) == 0) {
        // The session ended (its client is gone) or belongs to an earlier incarnation.
        return Reject(absl::FailedPreconditionError(
            "session_id: no such session (it ended, or the daemon restarted): attach again"));
      }
      setup.session_id = request.session_id();
    }
    const ServerConfig& server = deps_.config->server;
    const auto of_client = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      uint64_t n = opening_.count(client_key);
      for (const auto& [other_id, s] : streams_) n += s->setup().client_key == client_key;
      return n;
    };
    // (Waited for above; another open may have taken the room since: refused then.)
    if (shut_down_) return absl::UnavailableError("ringloaderd is shutting down");
    if (streams_.size() + opening_.size() >= server.max_streams) {
      return Reject(absl::ResourceExhaustedError(absl::StrCat(
          "too many open streams (server.max_streams = ", server.max_streams, ")")));
    }
    if (!client_key.empty() && of_client() >= server.max_streams_per_client) {
      return Reject(absl::ResourceExhaustedError(absl::StrCat(
          "too many open streams from ", client_key, " (server.max_streams_per_client = ",
          server.max_streams_per_client, ")")));
    }
    opening_.insert(client_key);
    id = next_stream_id_++;
  }
  // Leaves `opening_` on every path that does not reach Admit().
  struct Opening {
    StreamManager* self;
    const std::string& key;
    bool done = false;
    ~Opening() {
      if (done) return;
      std::lock_guard<std::mutex> lock(self->mu_);
      self->LeaveOpening(key);
    }
  } opening{this, client_key};
  setup.id = id;
  setup.open_id = open_id;
  shm::RingOptions ring_options;
  ring_options.name = shm::SegmentName(getpid(), deps_.incarnation, id);
  ring_options.slot_count = spec.ring_slots();
  ring_options.slot_bytes = slot_bytes;
  ring_options.incarnation = deps_.incarnation;
  ring_options.mode = deps_.config->server.segment_mode;
  ring_options.group = LookupGroup(deps_.config->server.segment_group);
  ring_options.shm_dir = deps_.config->server.shm_dir;
  absl::StatusOr<std::unique_ptr<shm::ProducerRing>> ring = shm::ProducerRing::Create(ring_options);
  if (!ring.ok()) {
    SPDLOG_WARN("stream open refused: {}", Text(ring.status()));
    return Reject(ring.status());
  }
  StreamDeps stream_deps{deps_.filler, deps_.observer, deps_.stats, deps_.failpoints,
                         deps_.cache};
  stream_deps.feeders = deps_.feeders;
  // Without local decoding the host reads no files ahead: feeders read them.
  const bool local_reads = deps_.feeders == nullptr || deps_.config->server.local_decode;
  stream_deps.read_pool = local_reads ? served->lane.get() : nullptr;
  stream_deps.memory = deps_.budget;
  stream_deps.files = deps_.read_files;
  stream_deps.read_window = deps_.read_window;
  stream_deps.max_files = deps_.read_stream_files;
  stream_deps.io_retry = std::chrono::milliseconds(deps_.config->server.io_retry_ms);
  auto stream = std::make_shared<Stream>(std::move(setup), std::move(*ring),
                                         std::move(*reservation), stream_deps);
  response->set_stream_id(id);
  response->set_incarnation(deps_.incarnation);
  response->set_segment_name(stream->segment_name());
  response->set_slot_count(stream->ring().slot_count());
  response->set_slot_bytes(stream->ring().slot_bytes());
  response->set_layout_version(1);
  response->set_dataset_size(dataset.size());
  response->set_samples_per_epoch(shard_size);
  // drop_last drops the shard's short last batch, so only whole batches count.
  response->set_batches_per_epoch(spec.drop_last()
                                      ? shard_size / spec.batch_size()
                                      : (shard_size + spec.batch_size() - 1) / spec.batch_size());
  response->set_stream_token(stream->setup().token);
  response->set_shm_dir(deps_.config->server.shm_dir);
  response->set_dataset_fingerprint(dataset.fingerprint());
  response->set_no_decoded_images(!dataset.has_images());
  ToProto(stream->setup().start_progress, response->mutable_start_progress());
  response->set_start_progress_applied(true);
  if (deps_.failpoints != nullptr) deps_.failpoints->OnStreamCreated();
  stream->Start();
  opening.done = true;
  const std::string resumed = ResumedText(stream->setup().start_progress, request);
  if (absl::Status admitted = Admit(std::move(stream), client_key, cancelled); !admitted.ok()) {
    return admitted;
  }
  SPDLOG_INFO(
      "stream opened id={} dataset={} rank={}/{} batch={} size={} slots={} start={}/{}/{}{} "
      "client=\"{}\"",
      id, spec.dataset(), spec.rank(), spec.world_size(), spec.batch_size(), spec.image_size(),
      spec.ring_slots(), request.start().epoch(), request.start().sequence(),
      request.start().cursor(), resumed,
      wire::EscapeBytes(request.client_name().substr(0, 128)));
  return absl::OkStatus();
}

absl::Status StreamManager::Admit(std::shared_ptr<Stream> stream, const std::string& client_key,
                                  const std::function<bool()>& cancelled) {
  // Copies: `stream` may be gone by the time they are used below.
  const std::string open_id = stream->setup().open_id;
  const std::string session = stream->setup().session_id;
  enum { kAdmitted, kShutDown, kClientGone, kGaveUp } outcome = kAdmitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    LeaveOpening(client_key);  // in the same hold as joining streams_: the count never dips
    if (shut_down_) {
      outcome = kShutDown;
    } else if (!session.empty() && sessions_.count(session) == 0) {
      outcome = kClientGone;  // its client died while the stream was being made
    } else if (TakeLostOpen(open_id) || (cancelled && cancelled())) {
      outcome = kGaveUp;
    } else {
      streams_[stream->id()] = stream;
    }
  }
  if (outcome == kAdmitted) return absl::OkStatus();
  // The last reference: its ring and reservation go back before the waiting opens are woken.
  std::vector<std::shared_ptr<Stream>> gone;
  gone.push_back(std::move(stream));
  StreamsLeft(gone);
  switch (outcome) {
    case kShutDown:
      return absl::UnavailableError("ringloaderd is shutting down");
    case kClientGone:
      return Reject(absl::FailedPreconditionError(
          "session_id: the session ended while the stream was being opened: attach again"));
    default:
      return GaveUp(open_id);
  }
}

void StreamManager::LeaveOpening(const std::string& client_key) {
  opening_.erase(opening_.find(client_key));
  room_cv_.notify_all();
}

bool StreamManager::TakeLostOpen(const std::string& open_id) {
  if (open_id.empty()) return false;
  return lost_opens_.erase(open_id) != 0;
}

void StreamManager::RememberLostOpen(const std::string& open_id) {
  const auto now = std::chrono::steady_clock::now();
  // An open arrives within its call's deadline (the client's is at most 30 s): older entries
  // name opens that never came. Bounded besides, oldest first.
  for (auto it = lost_opens_.begin(); it != lost_opens_.end();) {
    it = now - it->second > kLostOpenMemory ? lost_opens_.erase(it) : std::next(it);
  }
  if (lost_opens_.size() >= kMaxLostOpens) {
    lost_opens_.erase(std::min_element(lost_opens_.begin(), lost_opens_.end(),
                                       [](const auto& a, const auto& b) {
                                         return a.second < b.second;
                                       }));
  }
  lost_opens_[open_id] = now;
}

absl::Status StreamManager::GaveUp(const std::string& open_id) {
  deps_.stats->opens_abandoned.fetch_add(1, std::memory_order_relaxed);
  SPDLOG_INFO("stream open dropped: its client gave up waiting for it{}",
              open_id.empty() ? "" : " (and said so)");
  return absl::CancelledError("the client gave up on this open");
}

uint64_t StreamManager::WaitForRoom(const std::string& client_key,
                                    std::chrono::steady_clock::time_point give_up) {
  std::unique_lock<std::mutex> lock(mu_);
  const ServerConfig& server = deps_.config->server;
  room_cv_.wait_until(lock, give_up, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shut_down_) return true;
    if (streams_.size() + opening_.size() >= server.max_streams) return false;
    if (client_key.empty()) return true;
    uint64_t of_client = opening_.count(client_key);
    for (const auto& [id, s] : streams_) of_client += s->setup().client_key == client_key;
    return of_client < server.max_streams_per_client;
  });
  return streams_left_;
}

bool StreamManager::WaitForStreamToLeave(uint64_t left_before,
                                         std::chrono::steady_clock::time_point give_up) {
  std::unique_lock<std::mutex> lock(mu_);
  return room_cv_.wait_until(lock, give_up, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shut_down_ || streams_left_ != left_before;
  }) && !shut_down_;
}

void StreamManager::StreamsLeft(std::vector<std::shared_ptr<Stream>>& gone) {
  for (const auto& s : gone) s->Stop();
  gone.clear();  // their rings' reservations go back here (unless a call still holds one)
  std::lock_guard<std::mutex> lock(mu_);
  ++streams_left_;
  room_cv_.notify_all();
}

absl::StatusOr<std::string> StreamManager::OpenSession(const std::string& client_name) {
  std::string id = RandomBytes(16);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return absl::UnavailableError("ringloaderd is shutting down");
    // Each session holds a server thread: bounded like streams (a client has one session).
    const uint64_t max_sessions = uint64_t{2} * deps_.config->server.max_streams;
    if (sessions_.size() >= max_sessions) {
      return Reject(absl::ResourceExhaustedError(absl::StrCat(
          "too many attached clients (", max_sessions, " = 2 x server.max_streams)")));
    }
    sessions_[id] = client_name.substr(0, 128);
  }
  SPDLOG_DEBUG("session attached client=\"{}\"", wire::EscapeBytes(client_name.substr(0, 128)));
  return id;
}

void StreamManager::CloseSession(const std::string& session_id) {
  if (deps_.failpoints != nullptr) deps_.failpoints->OnSessionEnd();
  std::vector<std::shared_ptr<Stream>> closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto session = sessions_.find(session_id);
    if (session == sessions_.end()) return;
    sessions_.erase(session);
    for (auto it = streams_.begin(); it != streams_.end();) {
      if (it->second->setup().session_id == session_id) {
        closed.push_back(it->second);
        it = streams_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& s : closed) {
    SPDLOG_INFO("stream {} closed: its client (\"{}\") is gone; {} slots reclaimed", s->id(),
                wire::EscapeBytes(s->setup().client_name), s->ring().slot_count());
  }
  StreamsLeft(closed);
}

bool StreamManager::WaitUnlessShutDown(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return !shut_down_cv_.wait_for(lock, timeout, [this] { return shut_down_; });
}

size_t StreamManager::open_sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

absl::StatusOr<std::shared_ptr<Stream>> StreamManager::Find(uint64_t stream_id,
                                                            uint64_t incarnation,
                                                            const std::string& token) {
  if (incarnation != deps_.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stream ", stream_id, " belongs to daemon incarnation ", incarnation,
        "; this daemon is incarnation ", deps_.incarnation, " (it restarted): reopen the stream"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(stream_id);
  if (it == streams_.end()) {
    return absl::NotFoundError(
        absl::StrCat("stream ", stream_id, " not found (closed, or idle past the timeout)"));
  }
  if (!SameToken(it->second->setup().token, token)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "stream ", stream_id, ": wrong stream_token: only the client that opened a stream may "
        "use it (open your own stream)"));
  }
  return it->second;
}

absl::Status StreamManager::Next(const v1::NextBatchRequest& request,
                                 v1::NextBatchResponse* response,
                                 const std::function<bool()>& cancelled) {
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      Find(request.stream_id(), request.incarnation(), request.stream_token());
  if (!stream.ok()) return Reject(stream.status());
  for (const v1::Release& r : request.releases()) {
    // A bad release in a NextBatch call is the client's bug, not a reason to withhold its batch:
    // it changes nothing and is counted. ReleaseBatches reports such errors.
    if (absl::Status s = (*stream)->Release(r.slot(), r.ring_sequence(), r.copied_out()); !s.ok()) {
      Reject(s).IgnoreError();
    }
  }
  uint32_t wait_ms = request.wait_ms() == 0 ? deps_.config->server.max_wait_ms
                                            : std::min(request.wait_ms(),
                                                       deps_.config->server.max_wait_ms);
  std::optional<TrainerReport> trainer;
  if (request.has_trainer()) {
    trainer = TrainerReport{request.trainer().wait_ns(), request.trainer().step_ns(),
                            request.trainer().steps()};
  }
  absl::Status s = (*stream)->Next(absl::Milliseconds(wait_ms), response, cancelled,
                                   trainer ? &*trainer : nullptr);
  if (!s.ok() && s.code() != absl::StatusCode::kDataLoss) return Reject(s);
  return s;
}

absl::Status StreamManager::Release(const v1::ReleaseBatchesRequest& request) {
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      Find(request.stream_id(), request.incarnation(), request.stream_token());
  if (!stream.ok()) return Reject(stream.status());
  absl::Status first;
  for (const v1::Release& r : request.releases()) {
    absl::Status s = (*stream)->Release(r.slot(), r.ring_sequence(), r.copied_out());
    if (!s.ok() && first.ok()) first = s;
  }
  if (!first.ok()) return Reject(first);
  return absl::OkStatus();
}

absl::Status StreamManager::Close(const v1::CloseStreamRequest& request) {
  if (!request.open_id().empty()) return CloseOpen(request.open_id());
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      Find(request.stream_id(), request.incarnation(), request.stream_token());
  if (!stream.ok()) return Reject(stream.status());
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.erase(request.stream_id());
  }
  std::vector<std::shared_ptr<Stream>> gone = {*std::move(stream)};
  StreamsLeft(gone);
  SPDLOG_INFO("stream closed id={} by the client", request.stream_id());
  return absl::OkStatus();
}

absl::Status StreamManager::CloseOpen(const std::string& open_id) {
  if (open_id.size() != kOpenIdBytes) {
    return Reject(absl::InvalidArgumentError(
        absl::StrCat("open_id: must be ", kOpenIdBytes, " bytes (got ", open_id.size(), ")")));
  }
  std::vector<std::shared_ptr<Stream>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = streams_.begin(); it != streams_.end(); ++it) {
      if (SameToken(it->second->setup().open_id, open_id)) {
        gone.push_back(it->second);
        streams_.erase(it);
        break;
      }
    }
    // Still being opened, or not arrived yet: Open() drops it when it gets there.
    if (gone.empty()) RememberLostOpen(open_id);
  }
  if (gone.empty()) return absl::OkStatus();
  const uint64_t id = gone.front()->id();
  StreamsLeft(gone);
  deps_.stats->opens_abandoned.fetch_add(1, std::memory_order_relaxed);
  SPDLOG_INFO("stream closed id={}: its client gave up waiting for the open", id);
  return absl::OkStatus();
}

void StreamManager::Stats(v1::GetStatsResponse* response) {
  DaemonStats& stats = *deps_.stats;
  response->set_incarnation(deps_.incarnation);
  response->set_pid(static_cast<uint32_t>(getpid()));
  response->set_uptime_ms(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                            deps_.started)
          .count()));
  response->set_batches_served(stats.batches_served.load());
  response->set_images_decoded(stats.images_decoded.load());
  response->set_decode_errors(stats.decode_errors());
  for (const auto& [reason, count] : stats.errors_by_reason()) {
    (*response->mutable_decode_errors_by_reason())[reason] = count;
  }
  for (const BadFileRecord& r : stats.recent_bad_files()) {
    v1::BadFile* b = response->add_recent_bad_files();
    b->set_dataset(r.dataset);
    b->set_path(wire::EscapeBytes(r.path));
    b->set_reason(r.reason);
    b->set_message(wire::EscapeBytes(r.message));
  }
  for (const ServedDataset* served : deps_.datasets->All()) {
    const pipeline::Dataset& ds = *served->dataset;
    v1::DatasetStats* d = response->add_datasets();
    d->set_name(served->config.name);
    d->set_format(std::string(pipeline::DatasetFormatName(ds.format())));
    d->set_samples(ds.size());
    d->set_classes(ds.class_names().size());
    d->set_ignored_files(ds.ignored_count());
    for (const std::string& e : ds.ignored_examples()) d->add_ignored_examples(wire::EscapeBytes(e));
    if (served->lane != nullptr) {
      const pipeline::ReadPool::Health lane = served->lane->health();
      d->set_storage_stalled(lane.stalled);
      d->set_storage_stalled_ms(static_cast<uint64_t>(lane.stalled_for.count()));
      d->set_storage_stalls(lane.stalls);
      d->set_reads_in_flight(lane.running);
      d->set_reads_stuck(lane.stuck);
      response->set_reads_in_flight(response->reads_in_flight() + lane.running);
    }
    for (const pipeline::IndexProblem& p : served->dataset->index_problems()) {
      v1::BadFile* b = response->add_damaged_files();
      b->set_dataset(served->config.name);
      b->set_path(wire::EscapeBytes(p.file));
      b->set_reason(p.reason);
      b->set_message(wire::EscapeBytes(p.message));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    response->set_starting(starting_);
    response->set_starting_progress(starting_progress_);
  }
  response->set_images_per_second(stats.images_per_second());
  response->set_rss_bytes(CurrentRssBytes());
  response->set_memory_limit_bytes(deps_.budget->limit());
  response->set_memory_reserved_bytes(deps_.budget->reserved());
  response->set_memory_reserved_peak_bytes(deps_.budget->peak_reserved());
  response->set_memory_decoding_bytes(deps_.budget->decoding());
  response->set_rss_peak_bytes(PeakRssBytes());
  const HeapUse heap = ReadHeapUse();
  response->set_heap_arenas(heap.arenas);
  response->set_heap_bytes(heap.system_bytes);
  response->set_heap_free_bytes(heap.free_bytes);
  if (deps_.pool != nullptr) {
    response->set_decode_threads_abandoned(deps_.pool->abandoned());
    response->set_decode_threads_stuck(deps_.pool->stuck());
    response->set_decode_threads(deps_.pool->size());
    response->set_decode_threads_busy(deps_.pool->busy());
  }
  if (deps_.tls != nullptr) *response->mutable_tls() = deps_.tls->Status();
  if (deps_.feeders != nullptr) {
    for (v1::FeederStatus& f : deps_.feeders->Status()) *response->add_feeders() = std::move(f);
    response->set_feeder_fallback_samples(deps_.feeders->fallback_samples());
    response->set_local_decode_rate(deps_.feeders->local_rate());
    response->set_samples_decoded_ahead(deps_.feeders->ahead_samples());
  }
  if (deps_.progress != nullptr) {
    const LatencySnapshot read_wait = deps_.progress->read_wait();
    const LatencySnapshot decode = deps_.progress->latency();
    response->set_read_wait_seconds(read_wait.sum_seconds);
    response->set_samples_read(read_wait.count);
    response->set_decode_seconds(decode.sum_seconds);
    response->set_samples_decoded(decode.count);
  }
  response->set_io_depth(deps_.config->server.io_depth);
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0) {
    response->set_open_files_limit(files.rlim_cur);
  }
  if (deps_.read_files != nullptr) {
    response->set_read_files_limit(deps_.read_files->limit());
    response->set_read_files_held(deps_.read_files->held());
    response->set_read_files_peak(deps_.read_files->peak());
    response->set_read_files_refused(deps_.read_files->refused());
  }
  response->set_read_ahead_bytes(deps_.budget->read_ahead());
  response->set_read_ahead_peak_bytes(deps_.budget->peak_read_ahead());
  response->set_requests_rejected(stats.requests_rejected.load());
  response->set_opens_abandoned(stats.opens_abandoned.load());
  response->set_batches_copied_out(stats.batches_copied_out.load());
  response->set_bytes_served(stats.bytes_served.load());
  response->set_quarantines(stats.quarantines.load());
  response->set_daemon_restarts(stats.daemon_restarts.load());
  if (deps_.cache != nullptr) {
    const SampleCacheStats c = deps_.cache->stats();
    v1::CacheStats* cache = response->mutable_cache();
    cache->set_entries(c.entries);
    cache->set_bytes(c.bytes);
    cache->set_cap_bytes(deps_.cache->cap_bytes());
    cache->set_hits(c.hits);
    cache->set_misses(c.misses);
    cache->set_full(c.full);
  }
  for (const QuarantineEntry& e : deps_.quarantine->Quarantined()) {
    ToProto(e, response->add_quarantined());
  }
  StreamsStats(response);
}

void StreamManager::StreamsStats(v1::GetStatsResponse* response) {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, s] : streams_) streams.push_back(s);
  }
  response->set_streams_open(streams.size());
  for (const auto& s : streams) s->FillStats(response->add_streams());
}

void StreamManager::ListQuarantine(v1::ListQuarantineResponse* response) {
  for (const QuarantineEntry& e : deps_.quarantine->Quarantined()) {
    ToProto(e, response->add_samples());
  }
}

absl::Status StreamManager::ClearQuarantine(const v1::ClearQuarantineRequest& request,
                                            v1::ClearQuarantineResponse* response) {
  if (!request.dataset().empty() && deps_.datasets->Find(request.dataset()) == nullptr) {
    return Reject(
        absl::NotFoundError(absl::StrCat("unknown dataset \"", Shortened(request.dataset()), "\"")));
  }
  absl::StatusOr<uint64_t> cleared = deps_.quarantine->Clear(request.dataset());
  if (!cleared.ok()) return cleared.status();
  response->set_cleared(*cleared);
  SPDLOG_INFO("quarantine cleared for {}: {} samples",
              request.dataset().empty() ? "all datasets" : request.dataset(), *cleared);
  return absl::OkStatus();
}

void StreamManager::StartReaper() { reaper_ = std::thread([this] { ReaperLoop(); }); }

void StreamManager::ReaperLoop() {
  const auto idle_timeout =
      std::chrono::milliseconds(deps_.config->server.stream_idle_timeout_ms);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(reaper_mu_);
      if (reaper_cv_.wait_for(lock, std::chrono::milliseconds(250),
                              [this] { return stop_reaper_; })) {
        return;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    deps_.stats->Sample(now);
    if (const int64_t now_ns = base::SteadyNowNs(); history_.Due(now_ns)) {
      v1::GetStatsResponse stats;
      StreamsStats(&stats);  // the streams only: no heap walk or dataset stats every 5 s
      history_.Record(stats, now_ns);
    }
    std::vector<std::shared_ptr<Stream>> idle;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = streams_.begin(); it != streams_.end();) {
        // A stream of a live session is never idle: its client is connected (see the top of
        // stream_manager.h).
        const std::string& session = it->second->setup().session_id;
        const bool attached = !session.empty() && sessions_.count(session) != 0;
        if (!attached && now - it->second->last_activity() > idle_timeout) {
          idle.push_back(it->second);
          it = streams_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& s : idle) {
      SPDLOG_INFO("stream {} closed: no request for {} ms (client gone?); its {} slots reclaimed",
                  s->id(), idle_timeout.count(), s->ring().slot_count());
    }
    if (!idle.empty()) StreamsLeft(idle);
  }
}

void StreamManager::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    stop_reaper_ = true;
    reaper_cv_.notify_all();
  }
  if (reaper_.joinable()) reaper_.join();
  std::map<uint64_t, std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
    shut_down_cv_.notify_all();
    room_cv_.notify_all();
    streams.swap(streams_);
    sessions_.clear();
  }
  for (auto& [id, s] : streams) s->Stop();
}

size_t StreamManager::open_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return streams_.size();
}

std::shared_ptr<const Stream> StreamManager::FindStream(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second;
}

}  // namespace ringloader::server
