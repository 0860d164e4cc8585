#include "server/pipeline/tensor_schema.h"

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

}  // namespace ringloader::pipeline
