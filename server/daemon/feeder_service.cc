// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/feeder_service.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proto/wire_text.h"
#include "server/daemon/loader_service.h"
#include "server/daemon/stream_manager.h"
#include "server/pipeline/sampler.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {

grpc::Status FeederService::FeedSamples(grpc::ServerContext* context,
                                        const v1::FeedRequest* request,
                                        grpc::ServerWriter<v1::FeedFrame>* writer) {
  const ServedDataset* served = datasets_.Find(request->dataset());
  if (served == nullptr && datasets_.Indexing(request->dataset())) {
    return ToGrpc(absl::UnavailableError(absl::StrCat(
        "dataset \"", request->dataset(), "\" is still being indexed on this feeder")));
  }
  if (served == nullptr) {
    std::vector<std::string> names;
    for (const ServedDataset* d : datasets_.All()) names.push_back(d->config.name);
    return ToGrpc(absl::NotFoundError(absl::StrCat(
        "dataset \"", wire::EscapeBytes(request->dataset().substr(0, 256)),
        "\" is not served by this feeder (it serves: ",
        names.empty() ? "none" : absl::StrJoin(names, ", "), ")")));
  }
  const pipeline::Dataset& dataset = *served->dataset;
  if (request->dataset_fingerprint() != dataset.fingerprint()) {
    return ToGrpc(absl::FailedPreconditionError(absl::StrFormat(
        "dataset \"%s\": this feeder's fingerprint is %016x, the host's %016x: the two machines "
        "do not see the same files (its samples would differ)",
        served->config.name, dataset.fingerprint(), request->dataset_fingerprint())));
  }
  const int n = request->indices_size();
  if (n == 0 || n > kMaxFeedSamples) {
    return ToGrpc(absl::InvalidArgumentError(
        absl::StrCat("indices: must hold 1 to ", kMaxFeedSamples, " samples (got ", n, ")")));
  }
  std::vector<uint32_t> indices(request->indices().begin(), request->indices().end());
  for (uint32_t index : indices) {
    if (index >= dataset.size()) {
      return ToGrpc(absl::InvalidArgumentError(absl::StrCat(
          "indices: ", index, " is past dataset \"", served->config.name, "\"'s ",
          dataset.size(), " samples")));
    }
  }
  v1::StreamSpec spec = request->spec();
  spec.set_batch_size(static_cast<uint32_t>(n));
  spec.set_rank(0);
  spec.set_world_size(1);
  spec.set_ring_slots(0);
  if (absl::Status s = ValidateStreamSpec(config_, spec); !s.ok()) {
    return ToGrpc(absl::InvalidArgumentError(absl::StrCat("spec.", s.message())));
  }
  const image::TransformSpec transform = ToTransform(spec);
  const pipeline::BatchLayout layout =
      pipeline::ComputeBatchLayout(static_cast<uint32_t>(n), transform, &dataset);
  // The answer's buffer is drawn from memory_limit like a ring: a host cannot make a feeder
  // allocate past it, whatever it asks.
  absl::StatusOr<Reservation> held = budget_.Reserve(
      layout.total_bytes, absl::StrCat("a feed of ", n, " samples"), std::chrono::seconds(2));
  if (!held.ok()) return ToGrpc(held.status());
  std::vector<uint8_t> payload(layout.total_bytes);

  pipeline::ShardSpec shard_spec;
  shard_spec.seed = spec.seed();
  shard_spec.epoch = request->epoch();
  const pipeline::EpochShard shard(shard_spec, std::move(indices));
  pipeline::FillRequest fill;
  fill.dataset = &dataset;
  fill.shard = &shard;
  fill.cursor = 0;
  fill.batch_size = static_cast<uint32_t>(n);
  fill.transform = transform;
  fill.on_error = pipeline::OnError::kSkip;
  fill.seed = spec.seed();
  fill.epoch = request->epoch();
  fill.limits = DecodeLimitsOf(served->config);
  fill.stop = [context] { return context->IsCancelled(); };
  absl::StatusOr<pipeline::FilledBatch> filled = filler_.Fill(fill, payload, observer_);
  if (!filled.ok()) return ToGrpc(filled.status());

  v1::FeedFrame frame;
  v1::FeedHeader* header = frame.mutable_header();
  header->set_count(filled->count);
  for (const pipeline::SampleError& e : filled->errors) {
    v1::BadFile* bad = header->add_failed();
    bad->set_dataset(served->config.name);
    bad->set_path(wire::EscapeBytes(e.relative_path));
    bad->set_reason(e.reason);
    bad->set_message(wire::EscapeBytes(e.message));
  }
  header->set_payload_bytes(payload.size());
  header->set_payload_xxh64(XXH64(payload.data(), payload.size(), 0));
  if (!writer->Write(frame)) return grpc::Status(grpc::StatusCode::CANCELLED, "the host left");
  for (size_t offset = 0; offset < payload.size(); offset += kFeedFrameBytes) {
    v1::FeedFrame chunk;
    chunk.set_payload(payload.data() + offset, std::min(kFeedFrameBytes, payload.size() - offset));
    if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "the host left");
  }
  feeds_.fetch_add(1, std::memory_order_relaxed);
  samples_fed_.fetch_add(filled->count, std::memory_order_relaxed);
  return grpc::Status::OK;
}

}  // namespace ringloader::server
