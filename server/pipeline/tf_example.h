// SPDX-License-Identifier: Apache-2.0
#pragma once
// One training sample from a TFRecord record holding a tf.train.Example: the encoded image of a
// bytes feature and the label of an int64 feature (plus an offset: ImageNet TFRecords made by
// TensorFlow's scripts number classes 1..1000, `label_offset = -1` makes them 0..999).
//
// The record is read in place with a wire-format walk (no copy of the image, no TensorFlow): the
// image comes back as a span of the record. The same walk finds where the image starts in a
// record's first bytes only (LocateExampleImage), so its decode can be planned before the whole
// record is read.
//
// Errors are the sample's: DataLoss with reason "corrupt", the message naming `where` (the
// record, "FILE#N") and what is wrong: not an Example, a missing feature (with the features it
// has), a feature of the wrong kind or with not exactly one value.

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace ringloader::pipeline {

struct ExampleFields {
  std::span<const uint8_t> image;  // the encoded image (JPEG) bytes, inside the record
  int64_t label = 0;               // with label_offset applied
  bool has_label = false;          // false when ExampleKeys::label_feature is ""
};

struct ExampleKeys {
  std::string image_feature = "image/encoded";
  std::string label_feature = "image/class/label";  // "" = no label
  int64_t label_offset = 0;
};

absl::StatusOr<ExampleFields> ParseExampleRecord(std::span<const uint8_t> record,
                                                 const ExampleKeys& keys,
                                                 const std::string& where);

// Where the image feature's first value lies in a record of which only `head` (its first bytes)
// was read: (offset in the record, size), or nullopt when `head` does not reach its start.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t size = 0;
};
std::optional<ByteRange> LocateExampleImage(std::span<const uint8_t> head,
                                            const std::string& image_feature);

// A serialised Example with those two features (make-dataset, convert, tests). `label` is
// written as given (without the offset).
std::string MakeExampleRecord(const std::string& image, int64_t label, const ExampleKeys& keys);

}  // namespace ringloader::pipeline
