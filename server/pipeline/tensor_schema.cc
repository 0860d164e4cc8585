// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/tensor_schema.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ringloader::pipeline {

uint64_t TensorSchema::SampleBytes() const {
  uint64_t bytes = NpyTypeBytes(type);
  for (uint64_t d : shape) bytes *= d;
  return bytes;
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string TensorSchema::Describe() const {
  return absl::StrCat(NpyTypeName(type), " ", ShapeText(shape));
}

absl::Status CheckTensorName(absl::string_view name, TensorSource source) {
  if (name.empty()) return absl::InvalidArgumentError("a tensor needs a name");
  if (name.size() > kMaxTensorNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name of ", name.size(),
                                                   " bytes (at most ", kMaxTensorNameBytes, ")"));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) {
      return absl::InvalidArgumentError(
          "a tensor name may hold letters, digits, '_', '-' and '.' only");
    }
  }
  const bool beside_images = source == TensorSource::kWebDatasetMember;
  for (absl::string_view taken : {"images", "labels", "indices"}) {
    if (name == taken && (taken != "images" || beside_images)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", name, "' is the batch's own ", taken, " tensor"));
    }
  }
  if (beside_images && absl::EndsWith(name, "_lengths")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor name '", name, "' ends in _lengths, which names a ragged tensor's row counts"));
  }
  return absl::OkStatus();
}

}  // namespace ringloader::pipeline
