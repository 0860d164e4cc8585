#pragma once
// One training sample from a TFRecord record holding a tf.train.Example: the encoded image of a
// bytes feature and the label of an int64 feature (plus an offset: ImageNet TFRecords made by
// TensorFlow's scripts number classes 1..1000, `label_offset = -1` makes them 0..999).
//
// Errors are the sample's: DataLoss with reason "corrupt", the message naming `where` (the
// record, "FILE#N") and what is wrong: not an Example, a missing feature (with the features it
// has), a feature of the wrong kind or with not exactly one value.

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace ringloader::pipeline {

struct ExampleFields {
  std::string image;  // the encoded image (JPEG) bytes
  int64_t label = 0;  // with label_offset applied
};

struct ExampleKeys {
  std::string image_feature = "image/encoded";
  std::string label_feature = "image/class/label";
  int64_t label_offset = 0;
};

absl::StatusOr<ExampleFields> ParseExampleRecord(std::span<const uint8_t> record,
                                                 const ExampleKeys& keys,
                                                 const std::string& where);

// A serialised Example with those two features (make-dataset, convert, tests). `label` is
// written as given (without the offset).
std::string MakeExampleRecord(const std::string& image, int64_t label, const ExampleKeys& keys);

}  // namespace ringloader::pipeline
