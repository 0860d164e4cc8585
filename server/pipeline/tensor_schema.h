#pragma once
// The named tensors a batch carries beside (or instead of) its images: one per extra .npy member
// of a WebDataset sample, one per NAME.npy file of an "arrays" dataset. A schema is per sample;
// a batch of n samples holds n of them, back to back.

#include <cstdint>
#include <string>
#include <vector>

#include "server/pipeline/npy.h"

namespace ringloader::pipeline {

struct TensorSchema {
  std::string name;
  NpyType type = NpyType::kUint8;  // the element type (numpy's dtypes; see npy.h)
  std::vector<uint64_t> shape;     // of one sample (may be empty: a scalar)
  // Ragged (a dataset's `ragged` list): samples may hold fewer rows than shape[0], the longest
  // sample's; each is padded with zeros to shape[0] and its row count goes into NAME_lengths.
  bool ragged = false;

  uint64_t SampleBytes() const;
  // "float32 [8, 8]": for error messages.
  std::string Describe() const;
  bool operator==(const TensorSchema&) const = default;
};

// "[8, 8]".
std::string ShapeText(const std::vector<uint64_t>& shape);

}  // namespace ringloader::pipeline
