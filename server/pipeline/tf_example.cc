#include "server/pipeline/tf_example.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/tf_example.pb.h"
#include "server/image/sample_decoder.h"

namespace ringloader::pipeline {
namespace {

absl::Status Corrupt(const std::string& where, const std::string& what) {
  return image::WithReason(absl::DataLossError(absl::StrCat(where, ": ", what)), "corrupt");
}

const char* KindName(const tf::Feature& f) {
  switch (f.kind_case()) {
    case tf::Feature::kBytesList:
      return "a bytes_list";
    case tf::Feature::kFloatList:
      return "a float_list";
    case tf::Feature::kInt64List:
      return "an int64_list";
    case tf::Feature::KIND_NOT_SET:
      break;
  }
  return "empty";
}

// The feature `name`, or an error listing the features the Example has.
absl::StatusOr<const tf::Feature*> Find(const tf::Example& example, const std::string& name,
                                        const std::string& where) {
  const auto& features = example.features().feature();
  auto it = features.find(name);
  if (it != features.end()) return &it->second;
  std::vector<std::string> names;
  for (const auto& [key, value] : features) names.push_back(key);
  std::sort(names.begin(), names.end());
  return Corrupt(where, absl::StrCat("no feature '", name, "' (it has: ",
                                     names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
}

int ValueCount(const tf::Feature& f) {
  switch (f.kind_case()) {
    case tf::Feature::kBytesList:
      return f.bytes_list().value_size();
    case tf::Feature::kFloatList:
      return f.float_list().value_size();
    case tf::Feature::kInt64List:
      return f.int64_list().value_size();
    case tf::Feature::KIND_NOT_SET:
      break;
  }
  return 0;
}

// The feature must be of `kind` and hold exactly one value.
absl::Status CheckOne(const tf::Feature& f, tf::Feature::KindCase kind, const std::string& name,
                      const std::string& where) {
  if (f.kind_case() != kind) {
    tf::Feature wanted;
    if (kind == tf::Feature::kBytesList) wanted.mutable_bytes_list();
    if (kind == tf::Feature::kInt64List) wanted.mutable_int64_list();
    return Corrupt(where, absl::StrCat("feature '", name, "' is ", KindName(f), ", expected ",
                                       KindName(wanted)));
  }
  if (ValueCount(f) != 1) {
    return Corrupt(where, absl::StrCat("feature '", name, "' has ", ValueCount(f),
                                       " values, expected 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExampleFields> ParseExampleRecord(std::span<const uint8_t> record,
                                                 const ExampleKeys& keys,
                                                 const std::string& where) {
  tf::Example example;
  if (!example.ParseFromArray(record.data(), static_cast<int>(record.size()))) {
    return Corrupt(where, "the record is not a tf.train.Example");
  }
  absl::StatusOr<const tf::Feature*> image = Find(example, keys.image_feature, where);
  if (!image.ok()) return image.status();
  if (absl::Status s = CheckOne(**image, tf::Feature::kBytesList, keys.image_feature, where);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<const tf::Feature*> label = Find(example, keys.label_feature, where);
  if (!label.ok()) return label.status();
  if (absl::Status s = CheckOne(**label, tf::Feature::kInt64List, keys.label_feature, where);
      !s.ok()) {
    return s;
  }
  ExampleFields fields;
  fields.image = (*image)->bytes_list().value(0);
  fields.label = (*label)->int64_list().value(0) + keys.label_offset;
  return fields;
}

std::string MakeExampleRecord(const std::string& image, int64_t label, const ExampleKeys& keys) {
  tf::Example example;
  auto& features = *example.mutable_features()->mutable_feature();
  features[keys.image_feature].mutable_bytes_list()->add_value(image);
  features[keys.label_feature].mutable_int64_list()->add_value(label);
  return example.SerializeAsString();
}

}  // namespace ringloader::pipeline
