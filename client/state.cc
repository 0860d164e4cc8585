// SPDX-License-Identifier: Apache-2.0
// Stream state text (FormatState / ParseState) and option validation. See client.h for the format.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <xxhash.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/match.h"
#include "client/client.h"
#include "proto/resume_limits.h"

namespace ringloader::client {
namespace {

constexpr absl::string_view kMagic = "ringloader-state";
constexpr absl::string_view kVersion = "v3";
constexpr absl::string_view kV2 = "v2";           // no progress or cursors: still read
constexpr absl::string_view kOldVersion = "v1";  // no check field either: still read
constexpr absl::string_view kCheckKey = " check=";
constexpr absl::string_view kTerminator = " end";

// The check of a state line: XXH3-64 of everything before " check=", as 16 hex digits.
std::string CheckOf(absl::string_view body) {
  return absl::StrCat(absl::Hex(XXH3_64bits(body.data(), body.size()), absl::kZeroPad16));
}

bool Unreserved(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
         c == '~';
}

std::string PercentEncode(absl::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    if (Unreserved(c)) {
      out.push_back(c);
    } else {
      const auto b = static_cast<unsigned char>(c);
      out.push_back('%');
      out.push_back(kHex[b >> 4]);
      out.push_back(kHex[b & 15]);
    }
  }
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

[[noreturn]] void BadField(absl::string_view field, absl::string_view why) {
  throw Error(ErrorCode::kInvalidArgument,
              absl::StrCat("invalid ringloader state: field '", field, "': ", why));
}

[[noreturn]] void BadOption(absl::string_view option, absl::string_view why) {
  throw Error(ErrorCode::kInvalidArgument, absl::StrCat("StreamOptions.", option, ": ", why));
}

constexpr uint64_t kMaxEpoch = uint64_t{1} << 32;
constexpr float kMinStd = 1e-6f;
constexpr float kMaxNormValue = 1e6f;

// mean and std in 0..1 units: finite, std far enough from 0 that (x - mean) / std stays finite
// (the daemon applies the same bounds). `bad(field, why)` does not return.
void CheckNormalization(const StreamOptions& o, void (*bad)(absl::string_view, absl::string_view)) {
  for (float v : o.std) {
    if (!(v >= kMinStd && v <= kMaxNormValue)) {
      bad("std", absl::StrCat("values must be in [", kMinStd, ", ", kMaxNormValue, "] (got ", v, ")"));
    }
  }
  for (float v : o.mean) {
    if (!(v >= -kMaxNormValue && v <= kMaxNormValue)) {
      bad("mean", absl::StrCat("values must be in [-", kMaxNormValue, ", ", kMaxNormValue,
                               "] (got ", v, ")"));
    }
  }
}

std::string PercentDecode(absl::string_view field, absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      if (!Unreserved(s[i])) BadField(field, absl::StrCat("unencoded character in '", s, "'"));
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) BadField(field, "truncated %-escape");
    const int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
    if (hi < 0 || lo < 0) BadField(field, absl::StrCat("bad %-escape in '", s, "'"));
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

uint64_t ParseU64(absl::string_view field, absl::string_view value) {
  uint64_t v = 0;
  if (value.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(value.front())) ||
      !absl::SimpleAtoi(value, &v)) {
    BadField(field, absl::StrCat("not an unsigned integer: '", value, "'"));
  }
  return v;
}

uint32_t ParseU32(absl::string_view field, absl::string_view value) {
  const uint64_t v = ParseU64(field, value);
  if (v > UINT32_MAX) BadField(field, absl::StrCat("out of range: ", value));
  return static_cast<uint32_t>(v);
}

bool ParseBool(absl::string_view field, absl::string_view value) {
  if (value == "1") return true;
  if (value == "0") return false;
  BadField(field, absl::StrCat("must be 0 or 1, got '", value, "'"));
}

std::string FormatFloats(const std::vector<float>& values) {
  std::vector<std::string> parts;
  for (float v : values) {
    char buf[32];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest exact form
    parts.emplace_back(buf, ec == std::errc() ? end : buf);
  }
  return absl::StrJoin(parts, ",");
}

// "a,b,c" of unsigned integers (at least one, at most `max`, refused naming `why_max` before any
// more is stored); `end` (when not empty) reads as kWholeShard.
std::vector<uint64_t> ParseU64s(absl::string_view field, absl::string_view value, uint64_t max,
                                absl::string_view why_max, absl::string_view end = "") {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    if (out.size() == max) {
      BadField(field, absl::StrCat("more than ", max, " values (", why_max, ")"));
    }
    out.push_back(!end.empty() && part == end ? SavedWorld::kWholeShard : ParseU64(field, part));
  }
  return out;
}

std::vector<float> ParseFloats(absl::string_view field, absl::string_view value) {
  std::vector<float> out;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    float v = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size()) {
      BadField(field, absl::StrCat("not a number: '", part, "'"));
    }
    out.push_back(v);
  }
  if (out.size() != 3) BadField(field, absl::StrCat("needs 3 values, got ", out.size()));
  return out;
}

}  // namespace

void ValidateOptions(const StreamOptions& o) {
  if (o.dataset.empty()) BadOption("dataset", "must not be empty");
  if (o.batch_size == 0) BadOption("batch_size", "must be > 0");
  if (o.world_size == 0 || o.world_size > wire::kMaxWorldSize) {
    BadOption("world_size", absl::StrCat("must be in [1, ", wire::kMaxWorldSize, "] (got ",
                                         o.world_size, ")"));
  }
  if (o.rank >= o.world_size) {
    BadOption("rank", absl::StrCat("must be < world_size (got rank ", o.rank, ", world_size ",
                                   o.world_size, ")"));
  }
  if (o.image_size == 0) BadOption("image_size", "must be > 0");
  if (o.dtype != DType::kUint8 && o.dtype != DType::kFloat32) {
    BadOption("dtype", absl::StrCat("must be uint8 or float32 (got ", DTypeName(o.dtype), ")"));
  }
  for (const auto& [name, values] : {std::pair{"mean", &o.mean}, std::pair{"std", &o.std}}) {
    if (values->empty()) continue;
    if (o.dtype != DType::kFloat32) BadOption(name, "applies to dtype float32 only");
    if (values->size() != 3) {
      BadOption(name, absl::StrCat("needs 3 values (got ", values->size(), ")"));
    }
  }
  CheckNormalization(o, BadOption);
  // As the state's own bounds (ParseState): an epoch a state could not be loaded with is refused
  // when the stream is opened, not when the checkpoint is read back.
  if (o.start.epoch >= kMaxEpoch) {
    BadOption("start.epoch", absl::StrCat("must be < ", kMaxEpoch, " (got ", o.start.epoch, ")"));
  }
  if (o.end_epoch >= kMaxEpoch) {
    BadOption("end_epoch", absl::StrCat("must be < ", kMaxEpoch, " (got ", o.end_epoch, ")"));
  }
  if (o.end_epoch != 0 && o.start.epoch > o.end_epoch) {
    BadOption("start.epoch",
              absl::StrCat("is past end_epoch (", o.start.epoch, " > ", o.end_epoch, ")"));
  }
  if (o.reconnect_deadline.count() < 0) BadOption("reconnect_deadline", "must be >= 0");
  if (o.start_progress.beyond.size() > wire::kMaxBeyondPositions) {
    BadOption("start_progress.beyond",
              absl::StrCat("at most ", wire::kMaxBeyondPositions, " positions (got ",
                           o.start_progress.beyond.size(), ")"));
  }
  if (o.saved_world.world_size != 0) {
    if (o.saved_world.world_size > wire::kMaxWorldSize) {
      BadOption("saved_world.world_size", absl::StrCat("must be in [1, ", wire::kMaxWorldSize,
                                                       "] (got ", o.saved_world.world_size, ")"));
    }
    if (o.saved_world.cursors.size() != o.saved_world.world_size) {
      BadOption("saved_world.cursors",
                absl::StrCat("one per rank of saved_world.world_size ", o.saved_world.world_size,
                             " (got ", o.saved_world.cursors.size(), ")"));
    }
    if (o.start.sequence != 0 || o.start.cursor != 0) {
      BadOption("start", "must be an epoch's beginning (sequence 0, cursor 0) with a saved_world");
    }
  }
}

std::string FormatState(const StreamOptions& o, const Position& next,
                        const std::vector<uint64_t>& world_cursors) {
  std::string s = absl::StrCat(
      kMagic, " ", kVersion, " dataset=", PercentEncode(o.dataset), " batch_size=", o.batch_size,
      " seed=", o.seed, " rank=", o.rank, " world_size=", o.world_size,
      " image_size=", o.image_size, " augment=", o.augment == Augment::kEval ? "eval" : "train",
      " dtype=", DTypeName(o.dtype), " layout=", o.layout == Layout::kNCHW ? "nchw" : "nhwc",
      " shuffle=", o.shuffle ? 1 : 0, " drop_last=", o.drop_last ? 1 : 0,
      " end_epoch=", o.end_epoch, " ring_slots=", o.ring_slots, " epoch=", next.epoch,
      " sequence=", next.sequence, " cursor=", next.cursor);
  if (!o.mean.empty()) absl::StrAppend(&s, " mean=", FormatFloats(o.mean));
  if (!o.std.empty()) absl::StrAppend(&s, " std=", FormatFloats(o.std));
  if (o.resize == Resize::kExact) absl::StrAppend(&s, " resize=exact");
  if (o.dataset_fingerprint != 0) {
    absl::StrAppend(&s, " fingerprint=", absl::Hex(o.dataset_fingerprint, absl::kZeroPad16));
  }
  if (!o.start_progress.empty()) {
    absl::StrAppend(&s, " progress=", o.start_progress.prefix);
    if (!o.start_progress.beyond.empty()) {
      absl::StrAppend(&s, " beyond=", absl::StrJoin(o.start_progress.beyond, ","));
    }
  }
  if (!world_cursors.empty()) {
    absl::StrAppend(&s, " cursors=",
                    absl::StrJoin(world_cursors, ",", [](std::string* out, uint64_t c) {
                      absl::StrAppend(out, c == SavedWorld::kWholeShard ? "end" : absl::StrCat(c));
                    }));
  }
  absl::StrAppend(&s, kCheckKey, CheckOf(s), kTerminator);
  return s;
}

ResumeState ParseState(const std::string& text) {
  if (text.size() > wire::kMaxStateBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                absl::StrCat("invalid ringloader state: ", text.size(), " bytes, more than the ",
                             wire::kMaxStateBytes, " a state can be (not a state, or altered?)"));
  }
  absl::string_view line = absl::StripAsciiWhitespace(text);
  if (!absl::StartsWith(line, kMagic)) {
    throw Error(ErrorCode::kInvalidArgument,
                "invalid ringloader state: does not start with 'ringloader-state'");
  }
  if (absl::StrContains(line, '\n')) {
    throw Error(ErrorCode::kInvalidArgument, "invalid ringloader state: more than one line");
  }
  const absl::string_view after_magic = line.substr(kMagic.size());
  const bool v3 = absl::StartsWith(after_magic, absl::StrCat(" ", kVersion, " "));
  const bool checked = v3 || absl::StartsWith(after_magic, absl::StrCat(" ", kV2, " "));
  if (checked) {
    // "... check=<hex> end": cut short anywhere, the terminator or the check is missing; altered
    // anywhere, the check does not match.
    if (!absl::ConsumeSuffix(&line, kTerminator)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "invalid ringloader state: no terminator (' end'): the state was cut short");
    }
    const size_t at = line.rfind(kCheckKey);
    if (at == absl::string_view::npos) BadField("check", "missing");
    const absl::string_view body = line.substr(0, at);
    const absl::string_view check = line.substr(at + kCheckKey.size());
    if (check != CheckOf(body)) {
      BadField("check", absl::StrCat("does not match the state (", check, " != ", CheckOf(body),
                                     "): the state was altered or damaged"));
    }
    line = body;
  }
  std::vector<absl::string_view> tokens = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (tokens.size() < 2 || tokens[0] != kMagic) {
    throw Error(ErrorCode::kInvalidArgument,
                "invalid ringloader state: does not start with 'ringloader-state v3'");
  }
  if (tokens[1] != kVersion && tokens[1] != kV2 && tokens[1] != kOldVersion) {
    BadField("version", absl::StrCat("unsupported version '", tokens[1], "' (expected v3)"));
  }
  std::map<absl::string_view, absl::string_view> fields;
  for (size_t i = 2; i < tokens.size(); ++i) {
    const size_t eq = tokens[i].find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      BadField(tokens[i], "expected key=value");
    }
    absl::string_view key = tokens[i].substr(0, eq);
    if (!fields.emplace(key, tokens[i].substr(eq + 1)).second) BadField(key, "repeated");
  }
  // In the order FormatState writes them, so "missing" names the first one absent.
  static const std::vector<absl::string_view> kRequired = {
      "dataset",    "batch_size", "seed",     "rank",    "world_size", "image_size",
      "augment",    "dtype",      "layout",   "shuffle", "drop_last",  "end_epoch",
      "ring_slots", "epoch",      "sequence", "cursor"};
  for (const auto& [key, value] : fields) {
    const bool v3_field = key == "progress" || key == "beyond" || key == "cursors";
    if (std::find(kRequired.begin(), kRequired.end(), key) == kRequired.end() && key != "mean" &&
        key != "std" && key != "fingerprint" && key != "resize" && !(v3 && v3_field)) {
      BadField(key, "unknown field");
    }
  }
  for (absl::string_view key : kRequired) {
    if (!fields.count(key)) BadField(key, "missing");
  }

  ResumeState state;
  StreamOptions& o = state.options;
  o.dataset = PercentDecode("dataset", fields["dataset"]);
  if (o.dataset.empty()) BadField("dataset", "empty");
  o.batch_size = ParseU32("batch_size", fields["batch_size"]);
  o.seed = ParseU64("seed", fields["seed"]);
  o.rank = ParseU32("rank", fields["rank"]);
  o.world_size = ParseU32("world_size", fields["world_size"]);
  // Before anything is sized by it (a cursor per rank in ContinueState): an edited state loads.
  if (o.world_size == 0 || o.world_size > wire::kMaxWorldSize) {
    BadField("world_size", absl::StrCat("must be in [1, ", wire::kMaxWorldSize, "] (got ",
                                        o.world_size, "): the daemon serves no larger world"));
  }
  o.image_size = ParseU32("image_size", fields["image_size"]);
  const absl::string_view augment = fields["augment"];
  if (augment == "train") {
    o.augment = Augment::kTrain;
  } else if (augment == "eval") {
    o.augment = Augment::kEval;
  } else {
    BadField("augment", absl::StrCat("must be train or eval, got '", augment, "'"));
  }
  const absl::string_view dtype = fields["dtype"];
  if (dtype == "uint8") {
    o.dtype = DType::kUint8;
  } else if (dtype == "float32") {
    o.dtype = DType::kFloat32;
  } else {
    BadField("dtype", absl::StrCat("must be uint8 or float32, got '", dtype, "'"));
  }
  const absl::string_view layout = fields["layout"];
  if (layout == "nhwc") {
    o.layout = Layout::kNHWC;
  } else if (layout == "nchw") {
    o.layout = Layout::kNCHW;
  } else {
    BadField("layout", absl::StrCat("must be nhwc or nchw, got '", layout, "'"));
  }
  o.shuffle = ParseBool("shuffle", fields["shuffle"]);
  o.drop_last = ParseBool("drop_last", fields["drop_last"]);
  o.end_epoch = ParseU64("end_epoch", fields["end_epoch"]);
  o.ring_slots = ParseU32("ring_slots", fields["ring_slots"]);
  o.start.epoch = ParseU64("epoch", fields["epoch"]);
  o.start.sequence = ParseU64("sequence", fields["sequence"]);
  o.start.cursor = ParseU64("cursor", fields["cursor"]);
  if (fields.count("mean")) o.mean = ParseFloats("mean", fields["mean"]);
  if (fields.count("std")) o.std = ParseFloats("std", fields["std"]);
  if (fields.count("resize")) {
    const absl::string_view resize = fields["resize"];
    if (resize == "exact") {
      o.resize = Resize::kExact;
    } else if (resize != "fast") {
      BadField("resize", absl::StrCat("must be fast or exact, got '", resize, "'"));
    }
  }
  if (fields.count("fingerprint")) {
    const absl::string_view hex = fields["fingerprint"];
    if (hex.size() != 16 || !absl::SimpleHexAtoi(hex, &o.dataset_fingerprint) ||
        o.dataset_fingerprint == 0) {
      BadField("fingerprint", absl::StrCat("must be 16 hex digits, not all zero, got '", hex, "'"));
    }
  }

  if (fields.count("progress")) {
    o.start_progress.prefix = ParseU64("progress", fields["progress"]);
    if (fields.count("beyond")) {
      o.start_progress.beyond =
          ParseU64s("beyond", fields["beyond"], wire::kMaxBeyondPositions,
                    "the most a resume carries: the ranks' lead over the slowest rank");
    }
    uint64_t previous = o.start_progress.prefix;
    for (uint64_t p : o.start_progress.beyond) {
      if (p <= previous) BadField("beyond", "positions must ascend, each above progress");
      previous = p;
    }
    if (o.start_progress.empty()) BadField("progress", "0 with no beyond: omit it");
  } else if (fields.count("beyond")) {
    BadField("beyond", "needs progress");
  }
  if (fields.count("cursors")) {
    state.world_cursors =
        ParseU64s("cursors", fields["cursors"], o.world_size,
                  absl::StrCat("one per rank of world_size ", o.world_size), "end");
    if (state.world_cursors.size() != o.world_size) {
      BadField("cursors", absl::StrCat("one per rank of world_size ", o.world_size, " (got ",
                                       state.world_cursors.size(), ")"));
    }
    if (o.rank != 0 || o.start.sequence != 0 || o.start.cursor != 0) {
      BadField("cursors", "a job's state has rank=0 sequence=0 cursor=0");
    }
  }

  // Cross-field rules, reported against the state's field names.
  if (o.batch_size == 0) BadField("batch_size", "must be > 0");
  if (o.world_size == 0) BadField("world_size", "must be > 0");
  if (o.rank >= o.world_size) BadField("rank", "must be < world_size");
  if (o.image_size == 0) BadField("image_size", "must be > 0");
  if ((!o.mean.empty() || !o.std.empty()) && o.dtype != DType::kFloat32) {
    BadField(o.mean.empty() ? "std" : "mean", "applies to dtype float32 only");
  }
  if (o.end_epoch != 0 && o.start.epoch > o.end_epoch) BadField("epoch", "past end_epoch");
  // Beyond any real run, and room for epoch + 1 (a wrapped epoch would restart at 0).
  if (o.start.epoch >= kMaxEpoch) BadField("epoch", absl::StrCat("must be < ", kMaxEpoch));
  if (o.end_epoch >= kMaxEpoch) BadField("end_epoch", absl::StrCat("must be < ", kMaxEpoch));
  if (o.start.sequence > o.start.cursor) BadField("sequence", "must be <= cursor");
  if (o.start.cursor == 0 && o.start.sequence != 0) BadField("sequence", "must be 0 at cursor 0");
  CheckNormalization(o, BadField);
  return state;
}

}  // namespace ringloader::client
