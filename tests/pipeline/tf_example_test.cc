// tf.train.Example records: TensorFlow's wire layout, the image and label features, errors.
#include "server/pipeline/tf_example.h"

#include <catch2/catch.hpp>

#include <string>

#include "server/image/sample_decoder.h"

namespace ringloader::pipeline {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST_CASE("an Example encoded by hand in TensorFlow's field layout is read", "[tf_example]") {
  // Example{features{feature{"i": bytes_list{"JPG"}, "l": int64_list{5}}}}, field by field:
  // Example.features = 1, Features.feature = 1 (map entry: key 1, value 2), Feature.bytes_list
  // = 1 and int64_list = 3, BytesList.value = 1, Int64List.value = 1 (packed).
  const std::string image_entry("\x0a\x01i\x12\x07\x0a\x05\x0a\x03JPG", 12);
  const std::string label_entry("\x0a\x01l\x12\x05\x1a\x03\x0a\x01\x05", 10);
  const std::string features = std::string("\x0a\x0c", 2) + image_entry +
                               std::string("\x0a\x0a", 2) + label_entry;
  const std::string example = std::string("\x0a") + static_cast<char>(features.size()) + features;
  ExampleKeys keys;
  keys.image_feature = "i";
  keys.label_feature = "l";
  keys.label_offset = -1;
  auto fields = ParseExampleRecord(Bytes(example), keys, "f.tfrecord#0");
  REQUIRE(fields.ok());
  CHECK(fields->image == "JPG");
  CHECK(fields->label == 4);
  // And our writer writes the same fields back.
  auto again = ParseExampleRecord(Bytes(MakeExampleRecord("JPG", 5, keys)), keys, "x");
  REQUIRE(again.ok());
  CHECK(again->image == "JPG");
  CHECK(again->label == 4);
}

TEST_CASE("a record that is not the Example asked for names the record and the problem",
          "[tf_example]") {
  const ExampleKeys keys;
  auto check = [&](const std::string& record, const std::string& fragment) {
    auto fields = ParseExampleRecord(Bytes(record), keys, "shard-3.tfrecord#17");
    REQUIRE_FALSE(fields.ok());
    CHECK(fields.status().code() == absl::StatusCode::kDataLoss);
    CHECK(image::ErrorReason(fields.status()) == "corrupt");
    CHECK_THAT(std::string(fields.status().message()),
               Catch::StartsWith("shard-3.tfrecord#17: ") && Catch::Contains(fragment));
  };
  check(std::string("\xff\xff\xff", 3), "not a tf.train.Example");
  ExampleKeys other;
  other.image_feature = "jpeg";
  check(MakeExampleRecord("x", 1, other), "no feature 'image/encoded' (it has: image/class/label, jpeg)");
  ExampleKeys swapped;
  swapped.image_feature = "image/class/label";
  swapped.label_feature = "image/encoded";
  check(MakeExampleRecord("x", 1, swapped), "is an int64_list, expected a bytes_list");
}

}  // namespace
}  // namespace ringloader::pipeline
