// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/npy.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "server/pipeline/container_file.h"

namespace ringloader::pipeline {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr uint64_t kMaxHeaderBytes = 1 << 20;

struct TypeInfo {
  const char* descr;  // without the byte-order character
  NpyType type;
  const char* name;
  uint32_t bytes;
};
constexpr TypeInfo kTypes[] = {
    {"b1", NpyType::kBool, "bool", 1},       {"u1", NpyType::kUint8, "uint8", 1},
    {"i1", NpyType::kInt8, "int8", 1},       {"i2", NpyType::kInt16, "int16", 2},
    {"u2", NpyType::kUint16, "uint16", 2},   {"i4", NpyType::kInt32, "int32", 4},
    {"u4", NpyType::kUint32, "uint32", 4},   {"i8", NpyType::kInt64, "int64", 8},
    {"u8", NpyType::kUint64, "uint64", 8},   {"f2", NpyType::kFloat16, "float16", 2},
    {"f4", NpyType::kFloat32, "float32", 4}, {"f8", NpyType::kFloat64, "float64", 8},
};

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// The value of `key` in the header's Python dict literal: the text after "'key':" up to the next
// top-level ',' or '}' (a tuple's commas are inside parentheses).
std::string_view DictValue(std::string_view dict, std::string_view key) {
  const std::string quoted = "'" + std::string(key) + "'";
  size_t at = dict.find(quoted);
  if (at == std::string_view::npos) return {};
  at = dict.find(':', at + quoted.size());
  if (at == std::string_view::npos) return {};
  size_t end = at + 1;
  int depth = 0;
  for (; end < dict.size(); ++end) {
    const char c = dict[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  std::string_view v = dict.substr(at + 1, end - at - 1);
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return v;
}

// Where the header dict starts (`prefix`) and how long it is, from the version's length field
// (2 bytes in version 1, 4 in versions 2 and 3). False if `head` is too short to hold the field.
bool HeaderLength(const std::string& head, uint64_t* prefix, uint64_t* header_len) {
  const bool long_field = static_cast<uint8_t>(head[6]) >= 2;
  *prefix = long_field ? 12 : 10;
  if (head.size() < *prefix) return false;
  *header_len = 0;
  for (int i = long_field ? 3 : 1; i >= 0; --i) {
    *header_len = *header_len << 8 | static_cast<uint8_t>(head[8 + i]);
  }
  return true;
}

}  // namespace

const char* NpyTypeName(NpyType type) {
  for (const TypeInfo& t : kTypes) {
    if (t.type == type) return t.name;
  }
  return "unknown";
}

uint32_t NpyTypeBytes(NpyType type) {
  for (const TypeInfo& t : kTypes) {
    if (t.type == type) return t.bytes;
  }
  return 0;
}

absl::StatusOr<NpyHeader> ParseNpyHeader(const std::string& head, uint64_t file_bytes,
                                         const std::string& path, bool allow_scalar) {
  if (head.size() < 10 || head.compare(0, 6, kMagic, 6) != 0) {
    return Bad(path, "not a .npy file (no \\x93NUMPY magic)");
  }
  const auto major = static_cast<uint8_t>(head[6]);
  uint64_t prefix = 0;
  uint64_t header_len = 0;
  if (major < 1 || major > 3) {
    return Bad(path, absl::StrCat(".npy format version ", major, " is not supported (1-3 are)"));
  }
  if (!HeaderLength(head, &prefix, &header_len)) return Bad(path, "header cut short");
  if (header_len > kMaxHeaderBytes || prefix + header_len > head.size()) {
    return Bad(path, "header cut short or too long");
  }
  const std::string_view dict(head.data() + prefix, header_len);

  NpyHeader h;
  std::string_view descr = DictValue(dict, "descr");
  if (descr.size() < 3 || descr.front() != '\'' || descr.back() != '\'') {
    return Bad(path, absl::StrCat("dtype ", descr.empty() ? "(missing)" : std::string(descr),
                                  " is not supported (a structured or unknown dtype)"));
  }
  descr = descr.substr(1, descr.size() - 2);
  const char order = descr.front();
  const std::string_view code = descr.substr(1);
  const TypeInfo* found = nullptr;
  for (const TypeInfo& t : kTypes) {
    if (code == t.descr) found = &t;
  }
  const bool order_ok = order == '<' || order == '|' || (order == '=' && found && found->bytes == 1);
  if (found == nullptr || !order_ok || (order == '|' && found->bytes != 1)) {
    return Bad(path, absl::StrCat("dtype '", std::string(descr),
                                  "' is not supported (little-endian bool, ints, uints and "
                                  "floats of 1-8 bytes are)"));
  }
  h.type = found->type;
  if (DictValue(dict, "fortran_order") != "False") {
    return Bad(path, "Fortran-order arrays are not supported: save with np.ascontiguousarray");
  }
  std::string_view shape = DictValue(dict, "shape");
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') {
    return Bad(path, "the header has no shape tuple");
  }
  shape = shape.substr(1, shape.size() - 2);
  uint64_t row_items = 1;
  while (!shape.empty()) {
    while (!shape.empty() && (shape.front() == ' ' || shape.front() == ',')) shape.remove_prefix(1);
    if (shape.empty()) break;
    uint64_t dim = 0;
    size_t i = 0;
    for (; i < shape.size() && shape[i] >= '0' && shape[i] <= '9'; ++i) {
      if (dim > (uint64_t{1} << 40)) return Bad(path, "a dimension is too large");
      dim = dim * 10 + static_cast<uint64_t>(shape[i] - '0');
    }
    if (i == 0) return Bad(path, "the shape is not a tuple of integers");
    shape.remove_prefix(i);
    if (!h.shape.empty()) {
      if (dim != 0 && row_items > (uint64_t{1} << 40) / dim) return Bad(path, "rows are too large");
      row_items *= dim;
    }
    h.shape.push_back(dim);
  }
  if (h.shape.empty() && !allow_scalar) return Bad(path, "a 0-dimensional array has no rows");
  h.data_offset = prefix + header_len;
  h.row_bytes = row_items * found->bytes;
  const uint64_t data_bytes = file_bytes - std::min(file_bytes, h.data_offset);
  if (h.shape.empty() && data_bytes < h.row_bytes) {
    return container::Damaged(path, h.data_offset, "truncated",
                              absl::StrCat("the scalar's ", h.row_bytes,
                                           " bytes are not all there"));
  }
  if (!h.shape.empty() && h.row_bytes != 0 && h.shape[0] > data_bytes / h.row_bytes) {
    return container::Damaged(path, h.data_offset, "truncated",
                              absl::StrCat("the shape claims ", h.shape[0], " rows of ",
                                           h.row_bytes, " bytes but the file holds ", data_bytes,
                                           " bytes of data"));
  }
  return h;
}

std::string MakeNpyHeader(NpyType type, const std::vector<uint64_t>& shape) {
  const TypeInfo* info = &kTypes[0];
  for (const TypeInfo& t : kTypes) {
    if (t.type == type) info = &t;
  }
  std::string dict = absl::StrCat("{'descr': '", info->bytes == 1 ? "|" : "<", info->descr,
                                  "', 'fortran_order': False, 'shape': (");
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&dict, i == 0 ? "" : ", ", shape[i]);
  absl::StrAppend(&dict, shape.size() == 1 ? ",), }" : "), }");
  // numpy leaves room for shape[0] to grow to 21 digits, so the header can be rewritten in place.
  constexpr size_t kGrowthDigits = 21;
  if (!shape.empty()) {
    dict.append(kGrowthDigits - std::min(kGrowthDigits, std::to_string(shape[0]).size()), ' ');
  }
  // magic (6) + version (2) + length (2) + dict + '\n' up to a multiple of 64; like numpy, an
  // already aligned header still gets 64 spaces.
  dict.append(64 - (10 + dict.size() + 1) % 64, ' ');
  dict += '\n';
  std::string header(kMagic, 6);
  header += '\x01';  // version 1.0: a 2-byte little-endian length
  header += '\x00';
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>(dict.size() >> 8);
  return header + dict;
}

absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path) {
  absl::StatusOr<container::File> file = container::File::Open(path);
  if (!file.ok()) return file.status();
  const int fd = file->fd();
  // Headers are padded to 64 bytes and rarely longer than a few hundred; read more if this one is.
  std::string head(4096, '\0');
  int64_t got = container::ReadAt(fd, head.data(), head.size(), 0);
  uint64_t prefix = 0;
  uint64_t header_len = 0;
  if (got >= 12 && head.compare(0, 6, kMagic, 6) == 0 && HeaderLength(head, &prefix, &header_len) &&
      prefix + header_len > head.size() && header_len <= kMaxHeaderBytes) {
    head.resize(prefix + header_len);
    got = container::ReadAt(fd, head.data(), head.size(), 0);
  }
  if (got < 0) return container::IoError(path, static_cast<int>(-got));
  head.resize(static_cast<size_t>(got));
  return ParseNpyHeader(head, file->size(), path);
}

}  // namespace ringloader::pipeline
