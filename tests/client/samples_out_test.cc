// SPDX-License-Identifier: Apache-2.0
#include "client/ctl/samples_out.h"

#include <xxhash.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace ringloader::ctl {
namespace {

TEST_CASE("SampleDigest: XXH64 with seed 0 of the image bytes", "[ctl][samples_out]") {
  std::vector<uint8_t> bytes(224 * 224 * 3);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  CHECK(SampleDigest(bytes) == XXH64(bytes.data(), bytes.size(), 0));
  // XXH64 of the empty input with seed 0 is a published constant.
  CHECK(SampleDigest({}) == 0xEF46DB3751D8E999ULL);
  // One flipped bit anywhere changes the digest (what --samples-out comparisons rely on).
  const uint64_t before = SampleDigest(bytes);
  for (size_t at : {size_t{0}, size_t{1000}, bytes.size() - 1}) {
    bytes[at] ^= 1;
    CHECK(SampleDigest(bytes) != before);
    bytes[at] ^= 1;
  }
  CHECK(SampleDigest(bytes) == before);
}

TEST_CASE("FormatDigest: exactly 16 lowercase hex digits", "[ctl][samples_out]") {
  CHECK(FormatDigest(0) == "0000000000000000");
  CHECK(FormatDigest(0xABCDEF) == "0000000000abcdef");
  CHECK(FormatDigest(0xEF46DB3751D8E999ULL) == "ef46db3751d8e999");
}

TEST_CASE("FormatSampleLine: six tab-separated fields and a newline", "[ctl][samples_out]") {
  SampleRecord r;
  r.epoch = 2;
  r.sequence = 17;
  r.sample_index = 1234;
  r.label = 7;
  r.relative_path = "class_07/img_001234.jpg";
  r.digest = 0x1f;
  CHECK(FormatSampleLine(r) == "2\t17\t1234\t7\tclass_07/img_001234.jpg\t000000000000001f\n");

  r.relative_path = "";
  CHECK(FormatSampleLine(r) == "2\t17\t1234\t7\t-\t000000000000001f\n");
  r.relative_path = "odd\tname\n.jpg";
  CHECK(FormatSampleLine(r) == "2\t17\t1234\t7\todd\\tname\\n.jpg\t000000000000001f\n");
}

}  // namespace
}  // namespace ringloader::ctl
