// SPDX-License-Identifier: Apache-2.0
#pragma once
// The named tensors a batch carries beside (or instead of) its images: one per extra .npy member
// of a WebDataset sample, one per NAME.npy file of an "arrays" dataset. A schema is per sample;
// a batch of n samples holds n of them, back to back.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
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

// Where a dataset's tensor comes from: a WebDataset member "KEY.NAME.npy" (beside decoded
// images, and maybe ragged), or an arrays file "NAME.npy" (the batch has no decoded images).
enum class TensorSource { kWebDatasetMember, kArraysFile };

// A tensor name a batch can carry: never one the batch already uses ("labels", "indices"; beside
// a WebDataset's decoded images also "images" and "X_lengths", a ragged tensor's row counts), at
// most kMaxTensorNameBytes of letters, digits, '_', '-' and '.'. InvalidArgument saying which
// rule it breaks (the caller names the file).
inline constexpr size_t kMaxTensorNameBytes = 64;
absl::Status CheckTensorName(absl::string_view name, TensorSource source);

}  // namespace ringloader::pipeline
