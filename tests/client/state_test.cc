// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "client/client.h"

namespace ringloader::client {
namespace {

StreamOptions Unusual() {
  StreamOptions o;
  o.dataset = "my data/set %1\tä";
  o.batch_size = 17;
  o.seed = 18446744073709551615ULL;
  o.rank = 3;
  o.world_size = 8;
  o.image_size = 160;
  o.augment = Augment::kEval;
  o.dtype = DType::kFloat32;
  o.layout = Layout::kNCHW;
  o.shuffle = false;
  o.drop_last = true;
  o.end_epoch = 90;
  o.mean = {0.485f, 0.456f, 0.406f};
  o.std = {0.229f, 0.224f, 0.225f};
  o.ring_slots = 6;
  return o;
}

std::string ErrorOf(const std::string& state) {
  try {
    ParseState(state);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    return e.what();
  }
  FAIL("ParseState accepted: " << state);
  return "";
}

const std::string kGood =
    "ringloader-state v1 dataset=imagenet batch_size=64 seed=0 rank=0 world_size=1 "
    "image_size=224 augment=train dtype=uint8 layout=nhwc shuffle=1 drop_last=0 end_epoch=2 "
    "ring_slots=0 epoch=1 sequence=7 cursor=448";

TEST_CASE("State: FormatState then ParseState gives back every option and the position",
          "[client][state]") {
  const StreamOptions o = Unusual();
  const Position next{41, 12345, 197520};
  const std::string text = FormatState(o, next);
  CHECK(text.find('\n') == std::string::npos);
  CHECK(text.find('\t') == std::string::npos);
  CHECK(text.rfind("ringloader-state v3 ", 0) == 0);

  const StreamOptions p = ParseState(text).options;
  CHECK(p.dataset == o.dataset);
  CHECK(p.batch_size == o.batch_size);
  CHECK(p.seed == o.seed);
  CHECK(p.rank == o.rank);
  CHECK(p.world_size == o.world_size);
  CHECK(p.image_size == o.image_size);
  CHECK(p.augment == o.augment);
  CHECK(p.dtype == o.dtype);
  CHECK(p.layout == o.layout);
  CHECK(p.shuffle == o.shuffle);
  CHECK(p.drop_last == o.drop_last);
  CHECK(p.end_epoch == o.end_epoch);
  CHECK(p.mean == o.mean);  // floats round-trip exactly
  CHECK(p.std == o.std);
  CHECK(p.ring_slots == o.ring_slots);
  CHECK(p.start == next);
  CHECK(FormatState(p, p.start) == text);
}

TEST_CASE("State: the documented example parses", "[client][state]") {
  const StreamOptions o = ParseState("  " + kGood + "\n").options;
  CHECK(o.dataset == "imagenet");
  CHECK(o.end_epoch == 2);
  CHECK(o.start == Position{1, 7, 448});
  CHECK(o.mean.empty());
}

TEST_CASE("State: malformed states are rejected naming the field", "[client][state]") {
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  CHECK_THAT(ErrorOf(""), Catch::Contains("does not start with 'ringloader-state'"));
  CHECK_THAT(ErrorOf("hello world"), Catch::Contains("does not start with 'ringloader-state'"));
  CHECK_THAT(ErrorOf(replace(kGood, " v1 ", " v9 ")), Catch::Contains("'version'"));
  CHECK_THAT(ErrorOf(replace(kGood, "batch_size=64", "batch_size=x")),
             Catch::Contains("'batch_size'") && Catch::Contains("not an unsigned integer"));
  CHECK_THAT(ErrorOf(replace(kGood, "seed=0", "seed=-1")), Catch::Contains("'seed'"));
  CHECK_THAT(ErrorOf(replace(kGood, " cursor=448", "")),
             Catch::Contains("'cursor'") && Catch::Contains("missing"));
  CHECK_THAT(ErrorOf(kGood + " colour=red"),
             Catch::Contains("'colour'") && Catch::Contains("unknown"));
  CHECK_THAT(ErrorOf(kGood + " epoch=3"),
             Catch::Contains("'epoch'") && Catch::Contains("repeated"));
  CHECK_THAT(ErrorOf(replace(kGood, "rank=0", "rank=1")), Catch::Contains("'rank'"));
  CHECK_THAT(ErrorOf(replace(kGood, "dtype=uint8", "dtype=int64")), Catch::Contains("'dtype'"));
  CHECK_THAT(ErrorOf(replace(kGood, "augment=train", "augment=random")),
             Catch::Contains("'augment'"));
  CHECK_THAT(ErrorOf(replace(kGood, "layout=nhwc", "layout=hwc")), Catch::Contains("'layout'"));
  CHECK_THAT(ErrorOf(replace(kGood, "shuffle=1", "shuffle=yes")), Catch::Contains("'shuffle'"));
  CHECK_THAT(ErrorOf(replace(kGood, "dataset=imagenet", "dataset=a%2")),
             Catch::Contains("'dataset'"));
  CHECK_THAT(ErrorOf(replace(kGood, "dataset=imagenet", "dataset=a%zz")),
             Catch::Contains("'dataset'"));
  CHECK_THAT(ErrorOf(replace(kGood, "dataset=imagenet", "dataset=")), Catch::Contains("'dataset'"));
  CHECK_THAT(ErrorOf(replace(kGood, "world_size=1", "world_size=99999999999")),
             Catch::Contains("'world_size'"));
  CHECK_THAT(ErrorOf(replace(kGood, "epoch=1", "epoch=5")), Catch::Contains("'epoch'"));
  CHECK_THAT(ErrorOf(kGood + " mean=0.5,0.5,0.5"), Catch::Contains("'mean'"));  // uint8
  CHECK_THAT(ErrorOf(replace(kGood, "dtype=uint8", "dtype=float32") + " std=1,2"),
             Catch::Contains("'std'") && Catch::Contains("3 values"));
  CHECK_THAT(ErrorOf(kGood + " junk"), Catch::Contains("'junk'"));
}

TEST_CASE("ValidateOptions: names the option and the rule", "[client][options]") {
  auto error_of = [](const StreamOptions& o) -> std::string {
    try {
      ValidateOptions(o);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kInvalidArgument);
      return e.what();
    }
    return "accepted";
  };
  StreamOptions good;
  good.dataset = "d";
  CHECK(error_of(good) == "accepted");

  StreamOptions o = good;
  o.dataset = "";
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.dataset"));
  o = good;
  o.batch_size = 0;
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.batch_size"));
  o = good;
  o.rank = 4;
  o.world_size = 4;
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.rank") && Catch::Contains("world_size 4"));
  o = good;
  o.world_size = 0;
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.world_size"));
  o = good;
  o.image_size = 0;
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.image_size"));
  o = good;
  o.dtype = DType::kInt64;
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.dtype"));
  o = good;
  o.mean = {0.5f, 0.5f, 0.5f};  // uint8
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.mean"));
  o = good;
  o.dtype = DType::kFloat32;
  o.std = {1.0f, 0.0f, 1.0f};
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.std"));
  o = good;
  o.end_epoch = 2;
  o.start.epoch = 3;
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.start.epoch"));
  o = good;
  o.reconnect_deadline = std::chrono::milliseconds(-1);
  CHECK_THAT(error_of(o), Catch::Contains("StreamOptions.reconnect_deadline"));
}

TEST_CASE("DefaultEndpoint: $RINGLOADER_ENDPOINT wins, else the system socket", "[client]") {
  const char* saved = std::getenv("RINGLOADER_ENDPOINT");
  const std::string restore = saved ? saved : "";
  setenv("RINGLOADER_ENDPOINT", "unix:/tmp/x.sock", 1);
  CHECK(DefaultEndpoint() == "unix:/tmp/x.sock");
  setenv("RINGLOADER_ENDPOINT", "", 1);
  CHECK(DefaultEndpoint() == "unix:/run/ringloader/ringloader.sock");
  unsetenv("RINGLOADER_ENDPOINT");
  CHECK(DefaultEndpoint() == "unix:/run/ringloader/ringloader.sock");
  if (saved) setenv("RINGLOADER_ENDPOINT", restore.c_str(), 1);
}

TEST_CASE("Error: carries its code, and names are stable", "[client]") {
  const Error e(ErrorCode::kNotFound, "unknown dataset 'x'");
  CHECK(e.code() == ErrorCode::kNotFound);
  CHECK(std::string(e.what()) == "unknown dataset 'x'");
  CHECK(std::string(ErrorCodeName(ErrorCode::kUnavailable)) == "unavailable");
  CHECK(DTypeSize(DType::kFloat32) == 4);
  CHECK(DTypeSize(DType::kInt64) == 8);
  CHECK(std::string(DTypeName(DType::kUint8)) == "uint8");
}

TEST_CASE("State: a checkpoint cut short, altered or out of range is refused naming the problem",
          "[client][state]") {
  StreamOptions o;
  o.dataset = "imagenet-train";
  o.dtype = DType::kFloat32;
  o.std = {0.229f, 0.224f, 0.225f};
  o.end_epoch = 90;
  const std::string good = FormatState(o, {2, 7, 32});
  REQUIRE(ParseState(good).options.start == Position{2, 7, 32});
  CHECK(good.find('\n') == std::string::npos);
  CHECK_THAT(good, Catch::EndsWith(" end"));
  // Cut anywhere: inside the last field, inside std=, just before the terminator.
  for (size_t cut : {good.find("cursor=32") + 8, good.find("std=") + 6, good.size() - 1,
                     good.size() - 4}) {
    INFO(good.substr(0, cut));
    CHECK_THAT(ErrorOf(good.substr(0, cut)),
               Catch::Contains("cut short") || Catch::Contains("'check'"));
  }
  // Altered: one digit of the position, or std.
  auto altered = good;
  altered[altered.find("cursor=32") + 7] = '9';
  CHECK_THAT(ErrorOf(altered), Catch::Contains("'check'") && Catch::Contains("altered"));
  // Out of range even with a valid check (a tool that writes states): FormatState checks nothing.
  StreamOptions far = o;
  far.end_epoch = 0;
  CHECK_THAT(ErrorOf(FormatState(far, {~uint64_t{0}, 0, 0})),
             Catch::Contains("'epoch'") && Catch::Contains("must be <"));
  StreamOptions tiny = o;
  tiny.std = {1e-45f, 0.2f, 0.2f};
  CHECK_THAT(ErrorOf(FormatState(tiny, {0, 0, 0})), Catch::Contains("'std'"));
  CHECK_THAT(ErrorOf(FormatState(o, {1, 5, 0})), Catch::Contains("'sequence'"));
  // A second line is not a state.
  CHECK_THAT(ErrorOf(good + "\n" + good), Catch::Contains("more than one line"));
}

}  // namespace
}  // namespace ringloader::client
