// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/feeder_service.h"

#include <algorithm>
#include <cstring>
#include <condition_variable>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proto/wire_text.h"
#include "server/daemon/feed_frames.h"
#include "server/daemon/loader_service.h"
#include "server/daemon/stream_manager.h"
#include "server/pipeline/sampler.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

// Zeroes what lies outside `layout`'s tensors in `payload`: the gaps before each and the end.
void ZeroGaps(const pipeline::BatchLayout& layout, std::span<uint8_t> payload) {
  uint64_t at = 0;
  for (const pipeline::TensorPlacement& t : layout.tensors) {  // in payload order
    if (t.offset > at) std::memset(payload.data() + at, 0, t.offset - at);
    at = std::max(at, t.offset + t.bytes);
  }
  if (payload.size() > at) std::memset(payload.data() + at, 0, payload.size() - at);
}

// A host's string in an error (a dataset name, a label source): escaped and cut to 256 bytes,
// since a hostile one may be as long as a request.
std::string Echo(const std::string& theirs) {
  constexpr size_t kMost = 256;
  return theirs.size() <= kMost ? wire::EscapeBytes(theirs)
                                : absl::StrCat(wire::EscapeBytes(theirs.substr(0, kMost)), "...");
}

// Cancels `context` unless destroyed within `after`: a host that stops reading its answer
// blocks the write on flow control, and must not hold the feed's memory for ever.
class CutOff {
 public:
  CutOff(grpc::ServerContext* context, std::chrono::seconds after)
      : thread_([this, context, after] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, after, [this] { return done_; })) context->TryCancel();
        }) {}
  ~CutOff() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

// Reasons a sample may fail on this feeder but not elsewhere (or later).
bool MayPass(const std::string& reason, const std::string& message) {
  return reason == "deadline_exceeded" || reason == "io_error" || reason == "quarantined" ||
         reason == "other" || (reason == "too_large" && message.find("memory_limit") != std::string::npos);
}

}  // namespace

// The daemon's observer (crash records, quarantine, failpoints) without its strike for a sample
// that met its deadline: a host's request is no evidence against one of the feeder's samples.
class FeederService::NoStrikes final : public pipeline::SampleObserver {
 public:
  explicit NoStrikes(pipeline::SampleObserver& inner) : inner_(inner) {}
  absl::Status BeforeRead(const pipeline::Dataset& d, uint64_t i) override {
    return inner_.BeforeRead(d, i);
  }
  absl::Status Refused(const pipeline::Dataset& d, uint64_t i) override {
    return inner_.Refused(d, i);
  }
  void AfterRead(const pipeline::Dataset& d, uint64_t i, std::chrono::nanoseconds w) override {
    inner_.AfterRead(d, i, w);
  }
  absl::Status BeforeDecode(const pipeline::Dataset& d, uint64_t i, uint32_t worker) override {
    return inner_.BeforeDecode(d, i, worker);
  }
  void AfterDecode(const pipeline::Dataset& d, uint64_t i, uint32_t worker) override {
    inner_.AfterDecode(d, i, worker);
  }

 private:
  pipeline::SampleObserver& inner_;
};

// The feeds' answer buffers, within a quarter of memory_limit. An answer is let go when the last
// of its holders does: the handler, or a slice of it gRPC has not sent yet (PayloadFrame), which
// may be after the handler returned. The service waits for them at its end; answers still held
// then are left be (Orphan), and this with them.
class FeederService::Answers final {
 public:
  Answers(MemoryBudget& budget, uint64_t share)
      : share_(share), spares_(budget, kSpareAnswers, kLargestSpareAnswer) {}

  // A buffer of `bytes` for `what`, or ResourceExhausted when feeds would hold more than their
  // share, or the budget has not got them.
  absl::StatusOr<std::shared_ptr<SpareBuffers::Buffer>> Take(uint64_t bytes,
                                                             const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (held_bytes_ + bytes > share_) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "feeds would hold ", held_bytes_ + bytes, " bytes, past their share ", share_,
            " (a quarter of memory_limit): decode these elsewhere"));
      }
      held_bytes_ += bytes;
      ++out_;
    }
    absl::StatusOr<SpareBuffers::Buffer> buffer = spares_.Take(bytes, what);
    if (!buffer.ok()) {
      LetGo(bytes);
      return buffer.status();
    }
    Answers* self = this;  // lives until every answer is let go, or for ever (Orphan)
    return std::shared_ptr<SpareBuffers::Buffer>(
        new SpareBuffers::Buffer(*std::move(buffer)), [self, bytes](SpareBuffers::Buffer* b) {
          // Orphaned: the daemon is ending, and its budget may be gone before this buffer's
          // reservation would be given back to it. Left to the process's end.
          if (self->orphaned_.load()) return;
          self->spares_.Give(std::move(*b));
          delete b;
          self->LetGo(bytes);  // the last touch of `self`
        });
  }

  // Waits up to `most` for every answer to be let go: false if some are still held.
  bool Drained(std::chrono::milliseconds most) {
    std::unique_lock<std::mutex> lock(mu_);
    return drained_.wait_for(lock, most, [this] { return out_ == 0; });
  }
  // Answers let go from now on are left be, and so must this be (never destroyed).
  void Orphan() { orphaned_.store(true); }

 private:
  void LetGo(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    held_bytes_ -= bytes;
    if (--out_ == 0) drained_.notify_all();
  }

  const uint64_t share_;
  SpareBuffers spares_;
  std::mutex mu_;
  std::condition_variable drained_;
  uint64_t held_bytes_ = 0;  // by answers not let go yet, under mu_
  int out_ = 0;              // answers not let go yet, under mu_
  std::atomic<bool> orphaned_{false};
};

std::string LabelSource(const pipeline::Dataset& dataset) {
  if (!dataset.has_labels()) return "none";
  const pipeline::DatasetSpec& spec = dataset.spec();
  const std::string format = pipeline::DatasetFormatName(dataset.format());
  switch (dataset.format()) {
    case pipeline::DatasetFormat::kImageFolder:
    case pipeline::DatasetFormat::kManifest:
      return format;  // folder names or the manifest's column: in the fingerprinted index
    case pipeline::DatasetFormat::kWebDataset:
      return absl::StrCat(format, " member ", spec.label_key);
    case pipeline::DatasetFormat::kTfRecord:
      return absl::StrCat(format, " feature ", spec.label_feature, " offset ", spec.label_offset);
    case pipeline::DatasetFormat::kArrays:
      return absl::StrCat(format, " array ", spec.label_array);
  }
  return format;
}

FeederService::FeederService(const ServerConfig& config, const DatasetRegistry& datasets,
                             pipeline::BatchFiller& filler, MemoryBudget& budget,
                             pipeline::SampleObserver* observer, std::string lie)
    : config_(config), datasets_(datasets), filler_(filler),
      answers_(std::make_unique<Answers>(budget, config.memory_limit_bytes / 4)),
      observer_(observer != nullptr ? std::make_unique<NoStrikes>(*observer) : nullptr),
      lie_(std::move(lie)) {
  AddMethod(new grpc::internal::RpcServiceMethod(
      kFeedSamplesMethod, grpc::internal::RpcMethod::SERVER_STREAMING,
      new grpc::internal::ServerStreamingHandler<FeederService, v1::FeedRequest, grpc::ByteBuffer>(
          [](FeederService* service, grpc::ServerContext* context, const v1::FeedRequest* request,
             grpc::ServerWriter<grpc::ByteBuffer>* writer) {
            return service->FeedSamples(context, request, writer);
          },
          this)));
}

FeederService::~FeederService() {
  // The server is shut down: gRPC lets go of the answers it was sending as it closes their
  // connections. Their buffers hold memory_limit reservations, so the budget must see them go.
  if (!answers_->Drained(std::chrono::seconds(5))) {
    SPDLOG_WARN("feeder: gRPC still holds answers 5 s after the feeder service stopped: left to "
                "the process's end");
    answers_->Orphan();
    (void)answers_.release();  // on purpose: gRPC's threads may still let go of its answers
  }
}

absl::StatusOr<FeederService::FeedAnswer> FeederService::Answer(
    const std::string& host, const v1::FeedRequest& request, const std::function<bool()>& left) {
  std::shared_ptr<std::timed_mutex> fill_turn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    HostFeeds& feeds = feeds_by_host_[host];
    if (feeds.in_progress >= kMaxFeedsPerHost) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this feeder runs ", kMaxFeedsPerHost, " feeds for ", host.empty() ? "this host" : host,
          " already: decode these elsewhere"));
    }
    ++feeds.in_progress;
    fill_turn = feeds.fill_turn;
  }
  // The host's place, held until its answer is sent (or dropped).
  std::shared_ptr<void> place(nullptr, [this, host](void*) {
    std::lock_guard<std::mutex> lock(mu_);
    if (--feeds_by_host_[host].in_progress == 0) feeds_by_host_.erase(host);
  });
  absl::StatusOr<FeedAnswer> answer = Fill(request, left, *fill_turn);
  if (answer.ok()) answer->place = std::move(place);
  return answer;
}

void FeederService::Sent(const FeedAnswer& answer) {
  feeds_.fetch_add(1, std::memory_order_relaxed);
  samples_fed_.fetch_add(answer.header.count(), std::memory_order_relaxed);
}

grpc::Status FeederService::FeedSamples(grpc::ServerContext* context,
                                        const v1::FeedRequest* request,
                                        grpc::ServerWriter<grpc::ByteBuffer>* writer) {
  absl::StatusOr<FeedAnswer> answer = Answer(ClientKeyOfPeer(context->peer()), *request,
                                             [context] { return context->IsCancelled(); });
  if (!answer.ok()) return ToGrpc(answer.status());
  const CutOff cut_off(context, kFeedWriteTimeout);
  if (!writer->Write(HeaderFrame(answer->header))) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the host left");
  }
  const std::span<const uint8_t> payload = answer->payload();
  for (size_t offset = 0; offset < payload.size(); offset += kFeedFrameBytes) {
    const std::span<const uint8_t> chunk(payload.data() + offset,
                                         std::min(kFeedFrameBytes, payload.size() - offset));
    if (!writer->Write(PayloadFrame(chunk, answer->buffer))) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the host left");
    }
  }
  Sent(*answer);
  return grpc::Status::OK;
}

absl::StatusOr<FeederService::FeedAnswer> FeederService::Fill(const v1::FeedRequest& request,
                                                              const std::function<bool()>& left,
                                                              std::timed_mutex& fill_turn) {
  const ServedDataset* served = datasets_.Find(request.dataset());
  if (served == nullptr && datasets_.Indexing(request.dataset())) {
    return absl::UnavailableError(absl::StrCat(
        "dataset \"", request.dataset(), "\" is still being indexed on this feeder"));
  }
  if (served == nullptr) {
    std::vector<std::string> names;
    for (const ServedDataset* d : datasets_.All()) names.push_back(d->config.name);
    return absl::NotFoundError(absl::StrCat(
        "dataset \"", Echo(request.dataset()),
        "\" is not served by this feeder (it serves: ",
        names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  const pipeline::Dataset& dataset = *served->dataset;
  if (request.dataset_fingerprint() != dataset.fingerprint()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "dataset \"%s\": this feeder's fingerprint is %016x, the host's %016x: the two machines "
        "do not see the same files (its samples would differ)",
        served->config.name, dataset.fingerprint(), request.dataset_fingerprint()));
  }
  if (!request.label_source().empty() && request.label_source() != LabelSource(dataset)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset \"", served->config.name, "\": this feeder's labels come from ",
        LabelSource(dataset), ", the host's from ", Echo(request.label_source()),
        ": the same samples would carry other labels"));
  }
  const image::DecodeLimits limits = DecodeLimitsOf(served->config);
  if (request.has_limits()) {
    const v1::FeedLimits& theirs = request.limits();
    const auto describe = [](uint64_t pixels, uint64_t bytes, bool warnings, uint32_t scans) {
      return absl::StrCat("max_pixels ", pixels, ", max_file_bytes ", bytes,
                          ", warnings_are_errors ", warnings ? "true" : "false", ", max_scans ",
                          scans);
    };
    if (theirs.max_pixels() != limits.max_pixels ||
        theirs.max_file_bytes() != limits.max_file_bytes ||
        theirs.warnings_are_errors() != limits.warnings_are_errors ||
        theirs.max_scans() != limits.max_scans) {
      return absl::FailedPreconditionError(absl::StrCat(
          "dataset \"", served->config.name, "\": this feeder's decode limits are ",
          describe(limits.max_pixels, limits.max_file_bytes, limits.warnings_are_errors,
                   limits.max_scans),
          ", the host's ",
          describe(theirs.max_pixels(), theirs.max_file_bytes(), theirs.warnings_are_errors(),
                   theirs.max_scans()),
          ": a sample one refuses the other would deliver"));
    }
  }
  const int n = request.indices_size();
  if (n == 0 || n > kMaxFeedSamples) {
    return absl::InvalidArgumentError(
        absl::StrCat("indices: must hold 1 to ", kMaxFeedSamples, " samples (got ", n, ")"));
  }
  std::vector<uint32_t> indices(request.indices().begin(), request.indices().end());
  if (std::set<uint32_t>(indices.begin(), indices.end()).size() != indices.size()) {
    return absl::InvalidArgumentError("indices: each sample at most once");
  }
  for (uint32_t index : indices) {
    if (index >= dataset.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices: ", index, " is past dataset \"", served->config.name, "\"'s ",
          dataset.size(), " samples"));
    }
  }
  v1::StreamSpec spec = request.spec();
  spec.set_batch_size(static_cast<uint32_t>(n));
  spec.set_rank(0);
  spec.set_world_size(1);
  spec.set_ring_slots(0);
  if (absl::Status s = ValidateStreamSpec(config_, spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  }
  const image::TransformSpec transform = ToTransform(spec);
  const pipeline::BatchLayout layout =
      pipeline::ComputeBatchLayout(static_cast<uint32_t>(n), transform, &dataset);
  // This host's turn first: a feed waiting behind another of its host's holds no memory.
  std::unique_lock<std::timed_mutex> turn(fill_turn, std::defer_lock);
  while (!turn.try_lock_for(std::chrono::milliseconds(50))) {
    if (left()) return absl::CancelledError("the host left");
  }
  // Given up while it waited its turn (a call held ahead that the rounds passed by): not filled.
  if (left()) return absl::CancelledError("the host left");
  // The answer's buffer is drawn from memory_limit, at once or not at all, and feeds together
  // hold at most a quarter of it: the feeder's own trainers come first.
  absl::StatusOr<std::shared_ptr<SpareBuffers::Buffer>> answer =
      answers_->Take(layout.total_bytes, absl::StrCat("a feed of ", n, " samples"));
  if (!answer.ok()) return answer.status();
  AnswerBytes& payload = (*answer)->bytes;
  // What a filled batch leaves unwritten (the gaps that align its tensors) must be neither
  // another answer's bytes (another host's, maybe) nor the allocator's leftovers. Fill writes
  // each tensor whole (a short batch zeroes its tail), so only the gaps are zeroed: zeroing all
  // of it cost 3% of a feeder's core (perf, feeder_bench).
  ZeroGaps(layout, payload);

  pipeline::ShardSpec shard_spec;
  shard_spec.seed = spec.seed();
  shard_spec.epoch = request.epoch();
  const pipeline::EpochShard shard(shard_spec, std::move(indices));
  pipeline::FillRequest fill;
  fill.dataset = &dataset;
  fill.shard = &shard;
  fill.cursor = 0;
  fill.batch_size = static_cast<uint32_t>(n);
  fill.transform = transform;
  fill.on_error = pipeline::OnError::kSkip;
  fill.seed = spec.seed();
  fill.epoch = request.epoch();
  fill.limits = limits;
  fill.stop = left;
  absl::StatusOr<pipeline::FilledBatch> filled = filler_.Fill(fill, payload, observer_.get());
  turn.unlock();
  if (!filled.ok()) return filled.status();
  if (left()) return absl::CancelledError("the host left");
  // A failure that may pass (or a shutdown's abandoned samples) is no verdict on the sample.
  std::string passing;  // the reason of one such failure
  for (const auto& [reason, count] : filled->skipped_by_reason) {
    if (MayPass(reason, "")) passing = reason;
  }
  for (const pipeline::SampleError& e : filled->errors) {
    if (MayPass(e.reason, e.message)) passing = e.reason;
  }
  if (!passing.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "a sample failed here with \"", passing,
        "\", which may pass or differ elsewhere: decode these elsewhere"));
  }

  v1::FeedHeader header;
  header.set_count(filled->count);
  for (const pipeline::SampleError& e : filled->errors) {
    v1::BadFile* bad = header.add_failed();
    bad->set_dataset(served->config.name);
    bad->set_path(wire::EscapeBytes(e.relative_path));
    bad->set_reason(e.reason);
    bad->set_message(wire::EscapeBytes(e.message));
  }
  if (lie_ == "index" && filled->count > 0) {  // failpoint: a sample not asked for
    const int64_t stranger = static_cast<int64_t>(dataset.size()) + 7;
    std::memcpy(payload.data() + layout.indices_offset, &stranger, 8);
  }
  if (lie_ == "label" && filled->count > 0) {  // failpoint: a wrong label, checksummed as right
    int64_t label = 0;
    std::memcpy(&label, payload.data() + layout.labels_offset, 8);
    ++label;
    std::memcpy(payload.data() + layout.labels_offset, &label, 8);
  }
  header.set_payload_bytes(payload.size());
  if (request.payload_xxh3()) {
    header.set_payload_xxh3(PayloadHash::Of(PayloadHash::Kind::kXxh3, payload));
  } else {
    header.set_payload_xxh64(PayloadHash::Of(PayloadHash::Kind::kXxh64, payload));
  }
  if (lie_ == "checksum" && !payload.empty()) payload[payload.size() / 2] ^= 0x5a;
  if (lie_ == "short" && !payload.empty()) payload.pop_back();
  if (lie_ == "slow") std::this_thread::sleep_for(std::chrono::seconds(3));
  header.set_data_port(data_port_.load());
  return FeedAnswer{std::move(header), *std::move(answer), nullptr};
}

}  // namespace ringloader::server
