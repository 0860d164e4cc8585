// SPDX-License-Identifier: Apache-2.0
// tf.train.Example records: TensorFlow's wire layout, the image and label features, errors.
#include "server/pipeline/tf_example.h"

#include <catch2/catch.hpp>

#include <limits>
#include <string>

#include "server/image/sample_decoder.h"

namespace ringloader::pipeline {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string Text(std::span<const uint8_t> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
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
  CHECK(Text(fields->image) == "JPG");
  CHECK(fields->label == 4);
  // And our writer writes the same fields back.
  const std::string written = MakeExampleRecord("JPG", 5, keys);  // the fields point into it
  auto again = ParseExampleRecord(Bytes(written), keys, "x");
  REQUIRE(again.ok());
  CHECK(Text(again->image) == "JPG");
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

TEST_CASE("the image is read in place, and found in a record's first bytes only",
          "[tf_example]") {
  ExampleKeys keys;
  const std::string image(5000, 'J');
  const std::string record = MakeExampleRecord(image, 7, keys);
  auto fields = ParseExampleRecord(Bytes(record), keys, "r");
  REQUIRE(fields.ok());
  // A span of the record itself, not a copy.
  CHECK(fields->image.data() >= reinterpret_cast<const uint8_t*>(record.data()));
  CHECK(fields->image.data() + fields->image.size() <=
        reinterpret_cast<const uint8_t*>(record.data()) + record.size());
  CHECK(Text(fields->image) == image);

  const auto offset = static_cast<uint64_t>(fields->image.data() -
                                            reinterpret_cast<const uint8_t*>(record.data()));
  // The whole record, a head that holds the image's start only, one that stops before it.
  auto whole = LocateExampleImage(Bytes(record), keys.image_feature);
  REQUIRE(whole.has_value());
  CHECK(whole->offset == offset);
  CHECK(whole->size == image.size());
  auto cut = LocateExampleImage(Bytes(record.substr(0, offset + 100)), keys.image_feature);
  REQUIRE(cut.has_value());
  CHECK(cut->offset == offset);
  CHECK(cut->size == 0);  // unknown: the head ends inside it
  CHECK_FALSE(LocateExampleImage(Bytes(record.substr(0, 3)), keys.image_feature).has_value());
  CHECK_FALSE(LocateExampleImage(Bytes(record), "other").has_value());
}

TEST_CASE("an unpacked int64 label is read, and an empty label_feature means no label",
          "[tf_example]") {
  // Example{features{"l": int64_list{value: 9 (unpacked, wire type 0)}, "i": bytes{"X"}}}.
  const std::string label_entry("\x0a\x01l\x12\x04\x1a\x02\x08\x09", 9);
  const std::string image_entry("\x0a\x01i\x12\x05\x0a\x03\x0a\x01X", 10);
  const std::string features = std::string("\x0a\x09", 2) + label_entry +
                               std::string("\x0a\x0a", 2) + image_entry;
  const std::string example = std::string("\x0a") + static_cast<char>(features.size()) + features;
  ExampleKeys keys{"i", "l", 0};
  auto fields = ParseExampleRecord(Bytes(example), keys, "r");
  REQUIRE(fields.ok());
  CHECK(fields->label == 9);
  CHECK(fields->has_label);
  CHECK(Text(fields->image) == "X");
  keys.label_feature = "";
  auto unlabelled = ParseExampleRecord(Bytes(example), keys, "r");
  REQUIRE(unlabelled.ok());
  CHECK_FALSE(unlabelled->has_label);
}

TEST_CASE("27: a label that label_offset would take past int64's range fails its record",
          "[tf_example]") {
  ExampleKeys keys;
  keys.label_offset = -(int64_t{1} << 40);
  const std::string lowest = MakeExampleRecord("x", std::numeric_limits<int64_t>::min() + 5, keys);
  auto fields = ParseExampleRecord(Bytes(lowest), keys, "f.tfrecord#3");
  REQUIRE_FALSE(fields.ok());
  CHECK(image::ErrorReason(fields.status()) == "corrupt");
  CHECK_THAT(std::string(fields.status().message()), Catch::Contains("out of int64's range"));
  keys.label_offset = int64_t{1} << 40;
  auto highest = ParseExampleRecord(
      Bytes(MakeExampleRecord("x", std::numeric_limits<int64_t>::max(), keys)), keys, "f#4");
  CHECK_FALSE(highest.ok());
  auto fine = ParseExampleRecord(Bytes(MakeExampleRecord("x", 7, keys)), keys, "f#5");
  REQUIRE(fine.ok());
  CHECK(fine->label == 7 + (int64_t{1} << 40));
}

// A length-delimited protobuf field (tag, varint length, body).
std::string Len(uint32_t field, const std::string& body) {
  std::string out;
  for (uint64_t v : {uint64_t{field} << 3 | 2, uint64_t{body.size()}}) {
    do {
      out.push_back(static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
      v >>= 7;
    } while (v != 0);
  }
  return out + body;
}

// An Example with `count` int64 features named "k0", "k1", ... and no image.
std::string ExampleWithKeys(uint64_t count) {
  std::string features;
  const std::string value = Len(3, Len(1, std::string("\x05", 1)));  // int64_list {5}
  for (uint64_t i = 0; i < count; ++i) {
    features += Len(1, Len(1, "k" + std::to_string(i)) + Len(2, value));
  }
  return Len(1, features);
}

TEST_CASE("27: an Example with many keys costs a bounded error line and bounded memory",
          "[tf_example]") {
  const ExampleKeys keys;
  const std::string thousand = ExampleWithKeys(1000);
  auto fields = ParseExampleRecord(Bytes(thousand), keys, "f.tfrecord#0");
  REQUIRE_FALSE(fields.ok());
  const std::string message(fields.status().message());
  CHECK_THAT(message, Catch::Contains("no feature 'image/encoded' (it has: k0, k1, ") &&
                          Catch::Contains(" and 992 more)"));
  CHECK(message.size() < 200);
  // Past 65,536 entries the record is not read further.
  const std::string many = ExampleWithKeys(400'000);
  auto refused = ParseExampleRecord(Bytes(many), keys, "f.tfrecord#1");
  REQUIRE_FALSE(refused.ok());
  CHECK(image::ErrorReason(refused.status()) == "corrupt");
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("more than 65536 features"));
}

}  // namespace
}  // namespace ringloader::pipeline
