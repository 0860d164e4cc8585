// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/sample_reader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/image/sample_decoder.h"
#include "server/pipeline/tf_example.h"
#include "server/pipeline/tfrecord.h"
#include "shm/base/text.h"

namespace ringloader::pipeline {
namespace {

// A label member longer than this is not a label.
constexpr uint64_t kMaxLabelMemberBytes = 1 << 20;
// An .npy member's header is read with this much of its start (numpy writes 128 bytes).
constexpr uint64_t kNpyHeadBytes = 4096;

ExampleKeys KeysOf(const DatasetSpec& spec) {
  return ExampleKeys{spec.image_feature, spec.label_feature, spec.label_offset};
}

// The label in a WebDataset .json member: the integer at top-level key `field` of the JSON
// object, parsed by a real JSON parser; anything else (not JSON, not an object, no such key, a
// float, a string, a number outside int64) is a message saying which.
absl::StatusOr<int64_t> JsonLabel(std::string_view text, const std::string& field) {
  using nlohmann::json;
  // Only the top level is kept: nested objects and arrays are parsed (the JSON must be valid)
  // but never built, so a deeply nested member costs neither stack nor memory.
  const json::parser_callback_t top_level_only = [](int depth, json::parse_event_t event,
                                                    json&) {
    const bool opens = event == json::parse_event_t::object_start ||
                       event == json::parse_event_t::array_start;
    return depth == 0 || !opens;
  };
  const json parsed = json::parse(text, top_level_only, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return absl::InvalidArgumentError("the .json member is not JSON");
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the .json member is a JSON ", parsed.type_name(), ", not an object"));
  }
  const auto it = parsed.find(field);
  if (it == parsed.end()) {
    return absl::InvalidArgumentError(absl::StrCat("the .json member has no field \"", field,
                                                   "\" at its top level"));
  }
  if (it->is_number_integer() &&
      (!it->is_number_unsigned() ||
       it->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    return it->get<int64_t>();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the .json member's \"", field, "\" is ",
      it->is_number_integer() ? "an integer beyond int64" : std::string("a ") + it->type_name(),
      ", not an integer: ", it->dump().substr(0, 40)));
}

// A label column's entry as int64; false for a uint64 above int64's range (served as an int64 it
// would turn negative, 2^64 - 1 into -1: the "no label" value). JSON and TFRecord labels out of
// int64's range fail their sample the same way.
bool LoadAsInt64(const uint8_t* p, NpyType type, int64_t* out) {
  switch (type) {
    case NpyType::kUint8: *out = *p; return true;
    case NpyType::kInt8: *out = static_cast<int8_t>(*p); return true;
    case NpyType::kInt16: { int16_t v; std::memcpy(&v, p, 2); *out = v; return true; }
    case NpyType::kUint16: { uint16_t v; std::memcpy(&v, p, 2); *out = v; return true; }
    case NpyType::kInt32: { int32_t v; std::memcpy(&v, p, 4); *out = v; return true; }
    case NpyType::kUint32: { uint32_t v; std::memcpy(&v, p, 4); *out = v; return true; }
    case NpyType::kInt64: { std::memcpy(out, p, 8); return true; }
    case NpyType::kUint64: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      *out = static_cast<int64_t>(v);
      return v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    }
    default: *out = 0; return true;  // IndexArrays refuses other label types
  }
}

}  // namespace

uint64_t RestBytes(const Dataset& dataset) {
  uint64_t bytes = 0;
  for (const TensorSchema& schema : dataset.tensors()) bytes += schema.SampleBytes();
  return bytes;
}

bool HasRest(const Dataset& dataset) {
  return dataset.has_labels() || !dataset.tensors().empty();
}

std::span<const uint8_t> SampleRest::tensor(const Dataset& dataset, uint32_t k) const {
  uint64_t offset = 0;
  for (uint32_t t = 0; t < k; ++t) offset += dataset.tensors()[t].SampleBytes();
  return std::span<const uint8_t>(tensors).subspan(offset, dataset.tensors()[k].SampleBytes());
}

absl::StatusOr<SampleReader> SampleReader::Open(const Dataset& dataset, uint64_t index,
                                                uint64_t max_image_bytes,
                                                std::chrono::milliseconds io_retry,
                                                std::function<bool(int64_t)> witness,
                                                bool* asked_storage) {
  IoRetryBudget budget(io_retry, {}, std::move(witness));
  bool asked = false;
  absl::StatusOr<SampleReader> reader =
      budget.Run<SampleReader>([&] { return OpenOnce(dataset, index, max_image_bytes, &asked); });
  if (reader.ok()) {
    reader->budget_ = budget;  // what is left of it is the reads'
    reader->asked_storage_ = asked;
  }
  if (asked_storage != nullptr) *asked_storage = asked;
  return reader;
}

absl::StatusOr<std::vector<uint8_t>> SampleReader::ReadImageHead(uint64_t max, bool* whole) {
  return budget_.Run<std::vector<uint8_t>>([&] { return ReadImageHeadOnce(max, whole); });
}

absl::StatusOr<ImageBytes> SampleReader::ReadImage() {
  return budget_.Run<ImageBytes>([&] { return ReadImageOnce(); });
}

absl::StatusOr<int64_t> SampleReader::ReadLabel() {
  return budget_.Run<int64_t>([&] { return ReadLabelOnce(); });
}

absl::StatusOr<uint64_t> SampleReader::ReadTensor(uint32_t k, std::span<uint8_t> out) {
  return budget_.Run<uint64_t>([&] { return ReadTensorOnce(k, out); });
}

absl::StatusOr<SampleRest> SampleReader::ReadRest() {
  SampleRest rest;
  if (dataset_->has_labels()) {
    absl::StatusOr<int64_t> label = ReadLabel();
    if (!label.ok()) return label.status();
    rest.label = *label;
  }
  const std::vector<TensorSchema>& tensors = dataset_->tensors();
  rest.tensors.resize(RestBytes(*dataset_));
  rest.rows.resize(tensors.size());
  uint64_t offset = 0;
  for (uint32_t k = 0; k < tensors.size(); ++k) {
    const uint64_t bytes = tensors[k].SampleBytes();
    absl::StatusOr<uint64_t> rows =
        ReadTensor(k, std::span<uint8_t>(rest.tensors).subspan(offset, bytes));
    if (!rows.ok()) return rows.status();
    rest.rows[k] = *rows;
    offset += bytes;
  }
  return rest;
}

absl::StatusOr<SampleReader> SampleReader::OpenOnce(const Dataset& dataset, uint64_t index,
                                                    uint64_t max_image_bytes, bool* asked) {
  SampleReader r(dataset, index);
  r.where_ = dataset.AbsolutePath(index);
  switch (dataset.format()) {
    case DatasetFormat::kImageFolder:
    case DatasetFormat::kManifest: {
      *asked = true;
      absl::StatusOr<image::SampleFile> file = image::SampleFile::Open(r.where_, max_image_bytes);
      if (!file.ok()) return file.status();
      r.read_bytes_ = file->size();
      r.file_.emplace(*std::move(file));
      return r;
    }
    case DatasetFormat::kWebDataset:
    case DatasetFormat::kTfRecord: {
      const Extent image = dataset.part(index, 0);
      const bool tar = dataset.format() == DatasetFormat::kWebDataset;
      if (image.missing()) {
        return r.Damaged("corrupt", absl::StrCat("no image member (image_key = \"",
                                                 absl::StrJoin(dataset.spec().image_keys, ";"),
                                                 "\")"));
      }
      if (image.size > max_image_bytes) {
        return r.Damaged("too_large",
                         absl::StrCat(tar ? "image member" : "record", " has ", image.size,
                                      " bytes, above max_file_bytes ", max_image_bytes));
      }
      if (image.size == 0) return r.Damaged("empty", tar ? "image member is empty" : "empty record");
      r.container_path_ = dataset.SampleFilePath(index);
      bool opened_now = false;
      absl::StatusOr<std::shared_ptr<const container::File>> file =
          dataset.open_files().Open(r.container_path_, &opened_now);
      *asked = *asked || opened_now;
      if (!file.ok()) return file.status();
      r.container_ = *std::move(file);
      r.read_bytes_ = image.size;
      return r;
    }
    case DatasetFormat::kArrays:
      return r;
  }
  return r;
}

absl::Status SampleReader::Damaged(std::string_view reason, const std::string& what) const {
  return image::WithReason(
      absl::DataLossError(absl::StrCat(where_, ": ", base::Sv(reason), ": ", what)), reason);
}

absl::Status SampleReader::ReadMember(Extent extent, const char* what, uint64_t max,
                                      std::string& out) {
  out.resize(std::min(extent.size, max));
  const int64_t got = container::ReadAt(container_->fd(), out.data(), out.size(), extent.offset);
  if (got < 0) return container::IoError(container_path_, static_cast<int>(-got));
  if (static_cast<uint64_t>(got) < out.size()) {
    return Damaged("truncated", absl::StrCat(what, " at offset ", extent.offset,
                                             " cut short (the file shrank since it was indexed)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> SampleReader::ReadImageHeadOnce(uint64_t max, bool* whole) {
  if (file_) {
    absl::StatusOr<std::vector<uint8_t>> head = file_->ReadHead(max);
    if (head.ok()) *whole = head->size() == file_->size();
    return head;
  }
  if (!container_) return absl::InternalError("ReadImageHead: this dataset has no images");
  const Extent extent = dataset_->part(index_, 0);
  std::string head;
  if (absl::Status s = ReadMember(extent, "image", max, head); !s.ok()) return s;
  const auto* bytes = reinterpret_cast<const uint8_t*>(head.data());
  if (dataset_->format() == DatasetFormat::kWebDataset) {
    *whole = head.size() == extent.size;
    return std::vector<uint8_t>(bytes, bytes + head.size());
  }
  // TFRecord: the image is a feature somewhere in the record.
  const std::optional<ByteRange> image =
      LocateExampleImage({bytes, head.size()}, dataset_->spec().image_feature);
  *whole = false;
  if (!image || image->offset >= head.size()) return std::vector<uint8_t>();
  *whole = image->size != 0 && image->offset + image->size <= head.size();
  const uint64_t end = image->size != 0 ? std::min<uint64_t>(image->offset + image->size, head.size())
                                        : head.size();
  return std::vector<uint8_t>(bytes + image->offset, bytes + end);
}

absl::StatusOr<ImageBytes> SampleReader::ReadImageOnce() {
  ImageBytes out;
  if (file_) {
    absl::StatusOr<std::vector<uint8_t>> all = file_->ReadAll();
    if (!all.ok()) return all.status();
    out.bytes = *std::move(all);
    out.size = out.bytes.size();
    return out;
  }
  if (!container_) return absl::InternalError("ReadImage: this dataset has no images");
  const Extent extent = dataset_->part(index_, 0);
  if (dataset_->format() == DatasetFormat::kWebDataset) {
    std::string member;
    if (absl::Status s = ReadMember(extent, "image member", extent.size, member); !s.ok()) return s;
    out.bytes.assign(member.begin(), member.end());
    out.size = out.bytes.size();
    return out;
  }
  if (absl::Status s = ReadTfRecord(container_->fd(), container_path_,
                                    TfRecordSpan{extent.offset, extent.size}, out.bytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<ExampleFields> fields =
      ParseExampleRecord(out.bytes, KeysOf(dataset_->spec()), where_);
  if (!fields.ok()) return fields.status();
  out.offset = static_cast<uint64_t>(fields->image.data() - out.bytes.data());
  out.size = fields->image.size();
  if (fields->has_label) record_label_ = fields->label;
  return out;
}

absl::StatusOr<int64_t> SampleReader::ReadLabelOnce() {
  switch (dataset_->format()) {
    case DatasetFormat::kImageFolder:
    case DatasetFormat::kManifest:
      return dataset_->label(index_);
    case DatasetFormat::kTfRecord:
      if (!record_label_) {
        // The image came from the eval cache, so its record was not read: read it for the label.
        absl::StatusOr<ImageBytes> record = ReadImageOnce();
        if (!record.ok()) return record.status();
        if (!record_label_) return absl::InternalError("ReadLabel: the record has no label");
      }
      return *record_label_;
    case DatasetFormat::kWebDataset: {
      const std::string& key = dataset_->spec().label_key;
      const bool json = absl::StartsWith(key, "json:");
      const Extent extent = dataset_->part(index_, 1);
      if (extent.missing()) {
        return Damaged("corrupt", absl::StrCat("no '", json ? "json" : key, "' member (label_key = \"",
                                               key, "\")"));
      }
      if (extent.size > kMaxLabelMemberBytes) {
        return Damaged("corrupt", absl::StrCat("label member of ", extent.size, " bytes"));
      }
      std::string text;
      if (absl::Status s = ReadMember(extent, "label member", extent.size, text); !s.ok()) return s;
      int64_t label = 0;
      if (json) {
        absl::StatusOr<int64_t> v = JsonLabel(text, key.substr(5));
        if (v.ok()) return *v;
        return Damaged("corrupt",
                       absl::StrCat(v.status().message(), " (label_key = \"", key, "\")"));
      }
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &label)) {
        return Damaged("corrupt", absl::StrCat("the '", key, "' member is not an integer: \"",
                                               text.substr(0, 40), "\""));
      }
      return label;
    }
    case DatasetFormat::kArrays: {
      if (!dataset_->has_labels()) return absl::InternalError("ReadLabel: no label column");
      const ArrayColumn& column = dataset_->columns().back();
      uint8_t row[8] = {};
      asked_storage_ = true;
      absl::StatusOr<container::File> file = container::File::Open(column.path);
      if (!file.ok()) return file.status();
      const int64_t got = container::ReadAt(file->fd(), row, column.header.row_bytes,
                                            column.header.RowOffset(index_));
      if (got < 0) return container::IoError(column.path, static_cast<int>(-got));
      if (static_cast<uint64_t>(got) < column.header.row_bytes) {
        return Damaged("truncated", absl::StrCat(column.path, " ends before row ", index_));
      }
      int64_t label = 0;
      if (!LoadAsInt64(row, column.header.type, &label)) {
        return Damaged("corrupt", absl::StrCat(column.path, ": row ", index_, ": label ",
                                               static_cast<uint64_t>(label),
                                               " (uint64) is out of int64's range"));
      }
      return label;
    }
  }
  return absl::InternalError("ReadLabel: unknown format");
}

absl::StatusOr<uint64_t> SampleReader::ReadTensorOnce(uint32_t k, std::span<uint8_t> out) {
  const TensorSchema& schema = dataset_->tensors()[k];
  if (dataset_->format() == DatasetFormat::kArrays) {
    const ArrayColumn& column = dataset_->columns()[k];
    if (column.header.row_bytes > out.size()) {  // the schema is the header's: never
      return absl::InternalError(absl::StrCat("tensor '", schema.name, "': rows of ",
                                              column.header.row_bytes, " bytes do not fit its ",
                                              out.size(), "-byte place"));
    }
    asked_storage_ = true;
    absl::StatusOr<container::File> file = container::File::Open(column.path);
    if (!file.ok()) return file.status();
    const int64_t got = container::ReadAt(file->fd(), out.data(), column.header.row_bytes,
                                          column.header.RowOffset(index_));
    if (got < 0) return container::IoError(column.path, static_cast<int>(-got));
    if (static_cast<uint64_t>(got) < column.header.row_bytes) {
      return Damaged("truncated", absl::StrCat(column.path, " ends before row ", index_,
                                               " (it shrank since the dataset was opened)"));
    }
    return schema.shape.empty() ? 1 : schema.shape[0];
  }
  const Extent extent = dataset_->part(index_, 2 + k);
  if (extent.missing()) {
    return Damaged("corrupt", absl::StrCat("no '", schema.name, ".npy' member (other samples of ",
                                           "the dataset have one: ", schema.Describe(), ")"));
  }
  std::string head;
  if (absl::Status s = ReadMember(extent, "tensor member", kNpyHeadBytes, head); !s.ok()) return s;
  absl::StatusOr<NpyHeader> header =
      ParseNpyHeader(head, extent.size, absl::StrCat(where_, ": ", schema.name, ".npy"),
                     /*allow_scalar=*/true);
  if (!header.ok()) {
    std::string_view reason = image::ErrorReason(header.status());
    if (reason == "other") {
      reason = absl::StrContains(header.status().message(), "not supported") ? "unsupported"
                                                                              : "corrupt";
    }
    return image::WithReason(absl::DataLossError(header.status().message()), reason);
  }
  const bool scalar = header->shape.empty();
  const bool same_rest = header->shape.size() == schema.shape.size() &&
                         (scalar || std::equal(header->shape.begin() + 1, header->shape.end(),
                                               schema.shape.begin() + 1));
  if (same_rest && !scalar && schema.ragged && header->type == schema.type &&
      header->shape[0] > schema.shape[0]) {
    return Damaged("too_large", absl::StrCat("tensor '", schema.name, "' has ", header->shape[0],
                                             " rows, above the batch's ", schema.shape[0],
                                             dataset_->spec().ragged_max_rows != 0
                                                 ? " (ragged_max_rows)"
                                                 : ""));
  }
  const bool fits = scalar || (schema.ragged ? header->shape[0] <= schema.shape[0]
                                             : header->shape[0] == schema.shape[0]);
  if (header->type != schema.type || !same_rest || !fits) {
    return Damaged("corrupt",
                   absl::StrCat("tensor '", schema.name, "' is ", NpyTypeName(header->type), " ",
                                ShapeText(header->shape), ", the batch's is ", schema.Describe(),
                                schema.ragged ? " (ragged: at most that many rows)" : ""));
  }
  const uint64_t data_bytes = header->DataBytes();
  if (data_bytes > out.size()) {  // the checks above make it fit; never write past `out`
    return absl::InternalError(absl::StrCat("tensor '", schema.name, "': ", data_bytes,
                                            " bytes do not fit its ", out.size(), "-byte place"));
  }
  const int64_t got = container::ReadAt(container_->fd(), out.data(), data_bytes,
                                        extent.offset + header->data_offset);
  if (got < 0) return container::IoError(container_path_, static_cast<int>(-got));
  if (static_cast<uint64_t>(got) < data_bytes) {
    return Damaged("truncated", absl::StrCat("tensor member '", schema.name, ".npy' cut short"));
  }
  // (A tensor of 0-row samples has a 0-byte place whose data() may be null.)
  if (out.size() > data_bytes) std::memset(out.data() + data_bytes, 0, out.size() - data_bytes);
  return scalar ? 1 : header->shape[0];
}

}  // namespace ringloader::pipeline
