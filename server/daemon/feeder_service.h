// SPDX-License-Identifier: Apache-2.0
#pragma once
// The feeder's side of service Feeder (server.feeder_listen): decodes the samples another host's
// daemon asks for, exactly as a stream of that host would, and streams them back.
//
// A request names a dataset, its fingerprint (a different one is refused: the files differ), a
// stream's transform and seed, an epoch and up to kMaxFeedSamples sample indices. The feeder fills
// one "batch" of those indices with the same BatchFiller its own streams use (on_error = skip,
// its own decode limits, quarantine and deadlines), into a buffer drawn from its memory_limit,
// and answers with a FeedHeader and the buffer in 1 MiB frames. It holds no cursor: everything a
// sample's bytes depend on is in the request.
//
// Hosts are untrusted, and the feeder's own trainers come first:
//   - feeds together hold at most a quarter of memory_limit, taken at once or refused
//     (RESOURCE_EXHAUSTED: the host decodes elsewhere), never waited for; an answer holds its
//     memory until gRPC has sent it (its frames are slices of the answer's buffer, not copies);
//   - at most kMaxFeedsPerHost at once per host address; duplicate indices are refused;
//   - a host that stops reading its answer is cut off after kFeedWriteTimeout;
//   - a feed's sample that meets its deadline is never struck on the feeder (the host's
//     request is no evidence against it), and a failure that may pass (deadline, I/O, memory,
//     quarantine, shutdown) fails the whole call UNAVAILABLE rather than reading as a bad file.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "proto/ringloader.grpc.pb.h"
#include "server/daemon/config.h"
#include "server/daemon/dataset_registry.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/spare_buffers.h"
#include "server/pipeline/batch_filler.h"

namespace ringloader::server {

inline constexpr int kMaxFeedSamples = 256;
inline constexpr size_t kFeedFrameBytes = 1 << 20;
// Feeds at once from one host (its address): more are RESOURCE_EXHAUSTED, decoded elsewhere.
inline constexpr int kMaxFeedsPerHost = 4;
// Answer buffers kept for the next feeds (SpareBuffers), and the largest.
inline constexpr size_t kSpareAnswers = 2;
inline constexpr uint64_t kLargestSpareAnswer = 32 << 20;
// A host that does not take its answer within this long is cut off. The frames gRPC holds still
// (queued on a connection that does not drain) hold the answer, within the feeds' share, until
// the connection goes: keepalive pings (kFeedKeepalive, kFeedKeepaliveTimeout, as gRPC spaces
// them) close one whose host is gone. Not verified: one whose write is stuck behind a zero window
// (its host stopped, its kernel still answering) may keep them until the host resumes or the
// feeder stops.
inline constexpr std::chrono::seconds kFeedWriteTimeout{30};
inline constexpr std::chrono::seconds kFeedKeepalive{20};
inline constexpr std::chrono::seconds kFeedKeepaliveTimeout{10};

// Where `dataset`'s labels come from, as host and feeder compare it (FeedRequest.label_source):
// its format and the keys that pick its labels, e.g. "tfrecord feature image/class/label offset
// -1"; "none" without labels. The fingerprint covers the files, not these.
std::string LabelSource(const pipeline::Dataset& dataset);

// Registered raw (feed_frames.h): its answers are written as byte buffers.
class FeederService final : public grpc::Service {
 public:
  // All outlive the service; `budget` also outlives the answers gRPC may still hold after it
  // (the service waits 5 s for them, then leaves them be). `observer` may be null.
  // `lie`: FailpointConfig::feed_lie (tests of the host's checks); empty = honest.
  FeederService(const ServerConfig& config, const DatasetRegistry& datasets,
                pipeline::BatchFiller& filler, MemoryBudget& budget,
                pipeline::SampleObserver* observer, std::string lie = "");
  ~FeederService();

  grpc::Status FeedSamples(grpc::ServerContext* context, const v1::FeedRequest* request,
                           grpc::ServerWriter<grpc::ByteBuffer>* writer);

  // A call's answer, filled: its header, and its payload's buffer. Dropping it gives back the
  // buffer (unless a gRPC slice still holds it) and the host's place among its kMaxFeedsPerHost.
  struct FeedAnswer {
    v1::FeedHeader header;
    std::shared_ptr<SpareBuffers::Buffer> buffer;
    std::shared_ptr<void> place;
    std::span<const uint8_t> payload() const {
      return {buffer->bytes.data(), buffer->bytes.size()};
    }
  };
  // Any transport's call (the data plane's, feed_socket.h): fills `request` for `host` (its
  // ClientKeyOfPeer). `left` says the host has gone (the fill stops). The error is the call's
  // status, as FeedSamples returns it.
  absl::StatusOr<FeedAnswer> Answer(const std::string& host, const v1::FeedRequest& request,
                                    const std::function<bool()>& left);
  // `answer` was sent whole: counted in feeds() and samples_fed().
  void Sent(const FeedAnswer& answer);
  // The port of server.feeder_data_listen, told in every answer's header (0 = none).
  void SetDataPort(uint16_t port) { data_port_.store(port); }

  uint64_t feeds() const { return feeds_.load(); }
  uint64_t samples_fed() const { return samples_fed_.load(); }

 private:
  class NoStrikes;
  class Answers;
  // `fill_turn`: held while filling, so that one host's feeds are filled one at a time, in the
  // order they came (its next round's lease, started ahead, waits behind the one it waits for
  // now instead of halving its speed), while each answer is sent as the next is filled.
  absl::StatusOr<FeedAnswer> Fill(const v1::FeedRequest& request, const std::function<bool()>& left,
                                  std::timed_mutex& fill_turn);

  const ServerConfig& config_;
  const DatasetRegistry& datasets_;
  pipeline::BatchFiller& filler_;
  // The answers' buffers and what they hold; shared with the gRPC slices that send them.
  std::unique_ptr<Answers> answers_;
  std::unique_ptr<NoStrikes> observer_;  // null without one
  const std::string lie_;
  std::mutex mu_;
  struct HostFeeds {
    int in_progress = 0;
    std::shared_ptr<std::timed_mutex> fill_turn = std::make_shared<std::timed_mutex>();
  };
  std::map<std::string, HostFeeds> feeds_by_host_;  // with feeds in progress, under mu_
  std::atomic<uint64_t> feeds_{0};
  std::atomic<uint64_t> samples_fed_{0};
  std::atomic<uint16_t> data_port_{0};
};

}  // namespace ringloader::server
