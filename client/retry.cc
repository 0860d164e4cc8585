// SPDX-License-Identifier: Apache-2.0
#include "client/retry.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ringloader::client {
namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    default:
      return "UNKNOWN_CODE";
  }
}

}  // namespace

Recovery Classify(grpc::StatusCode code, absl::string_view message, RpcKind kind) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::UNKNOWN:
      return Recovery::kReopen;
    case grpc::StatusCode::INTERNAL:
      return absl::StartsWith(message, "Received RST_STREAM") ? Recovery::kReopen : Recovery::kFail;
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return kind == RpcKind::kStreamCall ? Recovery::kReopen : Recovery::kFail;
    default:
      return Recovery::kFail;
  }
}

ErrorCode ToErrorCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return ErrorCode::kUnavailable;
    case grpc::StatusCode::NOT_FOUND:
      return ErrorCode::kNotFound;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return ErrorCode::kInvalidArgument;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return ErrorCode::kResourceExhausted;
    case grpc::StatusCode::DATA_LOSS:
      return ErrorCode::kDataLoss;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return ErrorCode::kFailedPrecondition;
    default:
      return ErrorCode::kInternal;
  }
}

std::string DescribeStatus(const grpc::Status& status) {
  if (status.error_message().empty()) return CodeName(status.error_code());
  return absl::StrCat(CodeName(status.error_code()), ": ", status.error_message());
}

Backoff::Backoff(uint64_t seed, std::chrono::microseconds initial, std::chrono::microseconds cap)
    : rng_(seed), initial_(initial), cap_(cap) {}

std::chrono::microseconds Backoff::NextDelay() {
  // 2^20 x 5 ms is far above any sane cap; stop doubling there so the shift cannot overflow.
  const uint32_t shift = std::min<uint32_t>(attempt_, 20);
  ++attempt_;
  const int64_t base = std::min<int64_t>(cap_.count(), initial_.count() << shift);
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return std::chrono::microseconds(static_cast<int64_t>(static_cast<double>(base) * jitter(rng_)));
}

}  // namespace ringloader::client
