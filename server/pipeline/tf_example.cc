// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/tf_example.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/tf_example.pb.h"
#include "server/image/sample_decoder.h"

namespace ringloader::pipeline {
namespace {

// Protocol buffer wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLen = 2;
constexpr uint32_t kFixed32 = 5;

// Field numbers of example.proto / feature.proto.
constexpr uint32_t kExampleFeatures = 1;  // Example.features
constexpr uint32_t kFeaturesEntry = 1;    // Features.feature (map entries)
constexpr uint32_t kEntryKey = 1;
constexpr uint32_t kEntryValue = 2;
constexpr uint32_t kBytesList = 1;  // Feature.kind
constexpr uint32_t kFloatList = 2;
constexpr uint32_t kInt64List = 3;
constexpr uint32_t kListValue = 1;  // *List.value

// A bounded cursor over (part of) a message. `truncated`: the message goes on past `end` (only
// its first bytes were read), so running out is not an error but the end of what is known.
struct Cursor {
  const uint8_t* base;  // the record's first byte: offsets are reported from here
  const uint8_t* pos;
  const uint8_t* end;
  bool truncated;
};

bool Varint(Cursor& c, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (c.pos == c.end) return false;
    const uint8_t b = *c.pos++;
    *v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

struct Field {
  uint32_t number = 0;
  uint32_t wire = 0;
  uint64_t varint = 0;  // kVarint
  Cursor body{};        // kLen: its payload (possibly truncated by the cursor's end)
};

enum class Step { kField, kEnd, kBad };

// The next field; kEnd at the end of the message (or of what was read of it).
Step Next(Cursor& c, Field* f) {
  if (c.pos == c.end) return Step::kEnd;
  const uint8_t* const start = c.pos;
  uint64_t tag = 0;
  if (!Varint(c, &tag)) return c.truncated ? Step::kEnd : Step::kBad;
  f->number = static_cast<uint32_t>(tag >> 3);
  f->wire = static_cast<uint32_t>(tag & 7);
  if (f->number == 0) return Step::kBad;
  const auto skip = [&](uint64_t n) {
    if (n <= static_cast<uint64_t>(c.end - c.pos)) {
      c.pos += n;
      return Step::kField;
    }
    c.pos = start;
    return c.truncated ? Step::kEnd : Step::kBad;
  };
  switch (f->wire) {
    case kVarint:
      if (!Varint(c, &f->varint)) return c.truncated ? Step::kEnd : Step::kBad;
      return Step::kField;
    case kFixed64:
      return skip(8);
    case kFixed32:
      return skip(4);
    case kLen: {
      uint64_t n = 0;
      if (!Varint(c, &n)) return c.truncated ? Step::kEnd : Step::kBad;
      const uint64_t left = static_cast<uint64_t>(c.end - c.pos);
      if (n > left && !c.truncated) return Step::kBad;
      f->body = Cursor{c.base, c.pos, c.pos + std::min(n, left), c.truncated && n > left};
      c.pos = f->body.end;
      return Step::kField;
    }
    default:
      return Step::kBad;
  }
}

// What a Feature holds.
struct FeatureInfo {
  uint32_t kind = 0;  // kBytesList, kFloatList, kInt64List; 0 = empty
  uint64_t count = 0;
  std::span<const uint8_t> first_bytes;  // bytes_list: the first value
  bool first_complete = false;
  uint64_t first_offset = 0;  // from the record's start
  uint64_t first_size = 0;    // its declared size (may run past a truncated head)
  int64_t first_int = 0;      // int64_list
};

bool ParseFeature(Cursor c, FeatureInfo* info) {
  Field f;
  Step s;
  while ((s = Next(c, &f)) == Step::kField) {
    if (f.wire != kLen || f.number < kBytesList || f.number > kInt64List) continue;
    info->kind = f.number;  // the last one set wins, as in protobuf's oneof
    info->count = 0;
    Cursor list = f.body;
    Field v;
    Step vs;
    while ((vs = Next(list, &v)) == Step::kField) {
      if (v.number != kListValue) continue;
      if (f.number == kBytesList && v.wire == kLen) {
        if (info->count++ == 0) {
          info->first_offset = static_cast<uint64_t>(v.body.pos - c.base);
          info->first_bytes = {v.body.pos, v.body.end};
          // The declared size: the bytes after the length varint up to the field's end.
          info->first_complete = !v.body.truncated;
          info->first_size = static_cast<uint64_t>(v.body.end - v.body.pos);
        }
      } else if (f.number == kInt64List && v.wire == kLen) {  // packed
        Cursor packed = v.body;
        uint64_t x = 0;
        while (packed.pos != packed.end && Varint(packed, &x)) {
          if (info->count++ == 0) info->first_int = static_cast<int64_t>(x);
        }
      } else if (f.number == kInt64List && v.wire == kVarint) {
        if (info->count++ == 0) info->first_int = static_cast<int64_t>(v.varint);
      } else if (f.number == kFloatList) {
        info->count += v.wire == kLen ? static_cast<uint64_t>(v.body.end - v.body.pos) / 4 : 1;
      }
    }
    if (vs == Step::kBad) return false;
  }
  return s != Step::kBad;
}

// Calls visit(key, feature cursor) for every map entry of the Example; false if malformed.
template <typename Visit>
bool WalkExample(Cursor c, Visit&& visit) {
  Field f;
  Step s;
  while ((s = Next(c, &f)) == Step::kField) {
    if (f.number != kExampleFeatures || f.wire != kLen) continue;
    Cursor features = f.body;
    Field entry;
    Step es;
    while ((es = Next(features, &entry)) == Step::kField) {
      if (entry.number != kFeaturesEntry || entry.wire != kLen) continue;
      Cursor e = entry.body;
      std::string_view key;
      bool has_value = false;
      Cursor value{};
      Field kv;
      Step ks;
      while ((ks = Next(e, &kv)) == Step::kField) {
        if (kv.wire != kLen) continue;
        if (kv.number == kEntryKey) {
          key = {reinterpret_cast<const char*>(kv.body.pos),
                 static_cast<size_t>(kv.body.end - kv.body.pos)};
        }
        if (kv.number == kEntryValue) {
          value = kv.body;
          has_value = true;
        }
      }
      if (ks == Step::kBad) return false;
      if (!visit(key, has_value ? &value : nullptr)) return false;
    }
    if (es == Step::kBad) return false;
  }
  return s != Step::kBad;
}

// A record's feature entries are bounded (a real Example has a few dozen at most), and an error
// names the first few (each cut to kMaxNamedFeatureBytes) and counts the rest.
constexpr uint64_t kMaxFeatureEntries = 1 << 16;
constexpr size_t kNamedFeatures = 8;
constexpr size_t kMaxNamedFeatureBytes = 64;

absl::Status Corrupt(const std::string& where, const std::string& what) {
  return image::WithReason(absl::DataLossError(absl::StrCat(where, ": ", what)), "corrupt");
}

const char* KindName(uint32_t kind) {
  switch (kind) {
    case kBytesList:
      return "a bytes_list";
    case kFloatList:
      return "a float_list";
    case kInt64List:
      return "an int64_list";
    default:
      return "empty";
  }
}

}  // namespace

absl::StatusOr<ExampleFields> ParseExampleRecord(std::span<const uint8_t> record,
                                                 const ExampleKeys& keys,
                                                 const std::string& where) {
  // Only the two features asked for are kept (later entries replace earlier), so a record with
  // 400,000 keys holds no more than one with two; the others are counted, and the first few
  // named for the error.
  std::optional<FeatureInfo> image_feature, label_feature;
  std::set<std::string> some_names;
  uint64_t entries = 0;
  const Cursor c{record.data(), record.data(), record.data() + record.size(), false};
  const bool ok = WalkExample(c, [&](std::string_view key, const Cursor* value) {
    if (++entries > kMaxFeatureEntries) return false;
    FeatureInfo info;
    if (value != nullptr && !ParseFeature(*value, &info)) return false;
    if (key == keys.image_feature) image_feature = info;
    if (!keys.label_feature.empty() && key == keys.label_feature) label_feature = info;
    if (some_names.size() < kNamedFeatures) {
      some_names.emplace(key.substr(0, kMaxNamedFeatureBytes));
    }
    return true;
  });
  if (!ok) {
    return Corrupt(where, entries > kMaxFeatureEntries
                              ? absl::StrCat("the record has more than ", kMaxFeatureEntries,
                                             " features")
                              : std::string("the record is not a tf.train.Example"));
  }
  const auto find = [&](const std::string& name, const std::optional<FeatureInfo>& feature,
                        uint32_t kind) -> absl::StatusOr<const FeatureInfo*> {
    if (!feature) {
      std::string names = some_names.empty() ? "none" : absl::StrJoin(some_names, ", ");
      if (entries > some_names.size()) {
        absl::StrAppend(&names, " and ", entries - some_names.size(), " more");
      }
      return Corrupt(where, absl::StrCat("no feature '", name, "' (it has: ", names, ")"));
    }
    const auto it = &*feature;
    if (it->kind != kind) {
      return Corrupt(where, absl::StrCat("feature '", name, "' is ", KindName(it->kind),
                                         ", expected ", KindName(kind)));
    }
    if (it->count != 1) {
      return Corrupt(where, absl::StrCat("feature '", name, "' has ", it->count,
                                         " values, expected 1"));
    }
    return it;
  };
  absl::StatusOr<const FeatureInfo*> image = find(keys.image_feature, image_feature, kBytesList);
  if (!image.ok()) return image.status();
  ExampleFields fields;
  fields.image = (*image)->first_bytes;
  if (!keys.label_feature.empty()) {
    absl::StatusOr<const FeatureInfo*> label =
        find(keys.label_feature, label_feature, kInt64List);
    if (!label.ok()) return label.status();
    // A crafted label near INT64's ends must fail its sample, not wrap (undefined behaviour).
    if (__builtin_add_overflow((*label)->first_int, keys.label_offset, &fields.label)) {
      return Corrupt(where, absl::StrCat("label ", (*label)->first_int, " + label_offset ",
                                         keys.label_offset, " is out of int64's range"));
    }
    fields.has_label = true;
  }
  return fields;
}

std::optional<ByteRange> LocateExampleImage(std::span<const uint8_t> head,
                                            const std::string& image_feature) {
  std::optional<ByteRange> found;
  const Cursor c{head.data(), head.data(), head.data() + head.size(), true};
  WalkExample(c, [&](std::string_view key, const Cursor* value) {
    if (key != image_feature || value == nullptr) return true;
    FeatureInfo info;
    if (ParseFeature(*value, &info) && info.kind == kBytesList && info.count >= 1) {
      found = ByteRange{info.first_offset, info.first_size};
      found->size = info.first_complete ? info.first_size : 0;  // unknown when cut off
    }
    return true;
  });
  return found;
}

std::string MakeExampleRecord(const std::string& image, int64_t label, const ExampleKeys& keys) {
  tf::Example example;
  auto& features = *example.mutable_features()->mutable_feature();
  features[keys.image_feature].mutable_bytes_list()->add_value(image);
  if (!keys.label_feature.empty()) {
    features[keys.label_feature].mutable_int64_list()->add_value(label);
  }
  return example.SerializeAsString();
}

}  // namespace ringloader::pipeline
