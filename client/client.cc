// Client, Connection, errors and dtypes. The stream logic lives in stream.cc.
#include "client/client.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "client/channel.h"
#include "client/internal.h"

namespace ringloader::client {

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
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return 1;
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return "uint8";
    case DType::kFloat32:
      return "float32";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

std::string DefaultEndpoint() {
  const char* env = std::getenv("RINGLOADER_ENDPOINT");
  if (env != nullptr && *env != '\0') return env;
  return "unix:/run/ringloader/ringloader.sock";
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
  channel_ = MakeChannel(*target);
  stub_ = v1::Loader::NewStub(channel_);
}

absl::StatusOr<std::shared_ptr<const shm::ConsumerRing>> Connection::MapSegment(
    const std::string& segment, uint64_t incarnation) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto key = std::make_pair(incarnation, segment);
  if (auto it = mappings_.find(key); it != mappings_.end()) {
    if (auto ring = it->second.lock()) return ring;
  }
  absl::StatusOr<std::unique_ptr<shm::ConsumerRing>> ring =
      shm::ConsumerRing::Open(segment, incarnation);
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
  return OpenStream(impl_->connection, options);
}

std::unique_ptr<Stream> Client::Resume(const std::string& state) {
  return Open(ParseState(state).options);
}

}  // namespace ringloader::client
