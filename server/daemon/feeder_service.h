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

#include <atomic>
#include <cstdint>

#include "proto/ringloader.grpc.pb.h"
#include "server/daemon/config.h"
#include "server/daemon/dataset_registry.h"
#include "server/daemon/memory_budget.h"
#include "server/pipeline/batch_filler.h"

namespace ringloader::server {

inline constexpr int kMaxFeedSamples = 256;
inline constexpr size_t kFeedFrameBytes = 1 << 20;

class FeederService final : public v1::Feeder::Service {
 public:
  // All outlive the service. `observer` may be null.
  FeederService(const ServerConfig& config, const DatasetRegistry& datasets,
                pipeline::BatchFiller& filler, MemoryBudget& budget,
                pipeline::SampleObserver* observer)
      : config_(config), datasets_(datasets), filler_(filler), budget_(budget),
        observer_(observer) {}

  grpc::Status FeedSamples(grpc::ServerContext* context, const v1::FeedRequest* request,
                           grpc::ServerWriter<v1::FeedFrame>* writer) override;

  uint64_t feeds() const { return feeds_.load(); }
  uint64_t samples_fed() const { return samples_fed_.load(); }

 private:
  const ServerConfig& config_;
  const DatasetRegistry& datasets_;
  pipeline::BatchFiller& filler_;
  MemoryBudget& budget_;
  pipeline::SampleObserver* const observer_;
  std::atomic<uint64_t> feeds_{0};
  std::atomic<uint64_t> samples_fed_{0};
};

}  // namespace ringloader::server
