// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/tar_shard.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/pipeline/container_file.h"
#include "server/pipeline/sample_list.h"

namespace ringloader::pipeline {
namespace {

using container::Damaged;
using container::IoError;
using container::ReadAt;

constexpr uint64_t kBlock = 512;
// Longest GNU long name or pax header we read (a corrupt size must not become an allocation).
constexpr uint64_t kMaxMetaBytes = 64 << 10;

// A NUL- or space-terminated octal field; false if it holds anything else.
bool ParseOctal(const char* field, size_t width, uint64_t* out) {
  uint64_t v = 0;
  size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  bool digits = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v >> 60) return false;
    v = v * 8 + static_cast<uint64_t>(field[i] - '0');
    digits = true;
  }
  for (; i < width; ++i) {
    if (field[i] != '\0' && field[i] != ' ') return false;
  }
  *out = v;
  return digits;
}

std::string Field(const char* p, size_t width) { return std::string(p, strnlen(p, width)); }

uint64_t PaddedSize(uint64_t size) { return (size + kBlock - 1) / kBlock * kBlock; }

// The records of a pax extended header that say what a member is called or how long it is:
// both GNU tar and Python's tarfile take the member's size from `size` (and find the next header
// after that many bytes), so a scan that kept the ustar size would see other members than they do.
struct PaxRecords {
  std::optional<std::string> path;
  std::optional<uint64_t> size;
};

// Parses the "<len> <key>=<value>\n" records of a pax header whose data is the first `size`
// bytes of `block` (the rest: its padding to 512 bytes). "" on success, else why not. tarfile
// parses records on into the padding, GNU tar stops at the size: anything but NULs there is
// refused, as is a malformed record or a size that is not a decimal number (tarfile reads such a
// size as 0).
std::string ParsePax(std::string_view block, uint64_t size, PaxRecords* out) {
  if (!std::all_of(block.begin() + size, block.end(), [](char c) { return c == '\0'; })) {
    return "bytes other than NUL after its records (readers disagree whether they are records)";
  }
  std::string_view pax = block.substr(0, size);
  while (!pax.empty()) {
    const size_t space = pax.find(' ');
    uint64_t len = 0;
    if (space == 0 || space == std::string_view::npos || space > 19) return "a malformed record";
    for (char c : pax.substr(0, space)) {
      if (c < '0' || c > '9') return "a record length that is not a number";
      len = len * 10 + static_cast<uint64_t>(c - '0');
    }
    if (len <= space + 2 || len > pax.size() || pax[len - 1] != '\n') return "a malformed record";
    const std::string_view record = pax.substr(space + 1, len - space - 2);  // without the '\n'
    const size_t eq = record.find('=');
    if (eq == 0 || eq == std::string_view::npos) return "a record without key=value";
    const std::string_view key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") out->path = std::string(value);
    if (key == "size") {
      if (value.empty() || value.size() > 19 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return absl::StrCat("a size that is not a decimal number: '",
                            absl::CHexEscape(std::string(value.substr(0, 24))), "'");
      }
      uint64_t v = 0;
      for (char c : value) v = v * 10 + static_cast<uint64_t>(c - '0');
      out->size = v;
    }
    pax.remove_prefix(len);
  }
  return "";
}

// What the metadata headers before a member ('L' long name, 'K' long link name, 'x' pax) said.
struct PendingMeta {
  std::optional<std::string> long_name;  // GNU 'L'
  bool pax = false;                      // a pax 'x' header was seen
  PaxRecords pax_records;
};

// Header types that carry no data in tarfile (it skips nothing after a link, a device, a FIFO or
// a directory; GNU tar nothing after a directory): with a size, the readers disagree where the
// next header is. tarfile and GNU tar also read an old-style regular file ('\0') whose name ends
// in '/' as a directory.
bool NoDataType(char type, std::string_view header_name) {
  if (type == '\0') return !header_name.empty() && header_name.back() == '/';
  return type >= '1' && type <= '6';
}

constexpr std::string_view kCutShort = "long-name or pax header cut short";

// Reads a metadata header's data (of `size` bytes at `data`, with its padding: tarfile reads a
// long name or pax records on into it) into `meta`. "" on success, else why not (kCutShort when
// the file ends first).
std::string ReadMeta(int fd, char type, uint64_t data, uint64_t size, uint64_t file_size,
                     PendingMeta& meta) {
  std::string block(std::min(PaddedSize(size), file_size - data), '\0');
  if (ReadAt(fd, block.data(), block.size(), data) != static_cast<int64_t>(block.size())) {
    return std::string(kCutShort);
  }
  if (type == 'x' || type == 'g') {
    PaxRecords records;
    std::string why = ParsePax(block, size, &records);
    if (why.empty() && type == 'x' && meta.pax) why = "a second pax header for one member";
    if (why.empty() && type == 'g' && (records.path || records.size)) {
      why = absl::StrCat("a global header sets '", records.size ? "size" : "path",
                         "', which tar readers apply to different members");
    }
    if (!why.empty()) return absl::StrCat("pax header: ", why);
    if (type == 'x') {
      meta.pax = true;
      meta.pax_records = std::move(records);
    }
    return "";
  }
  if (!std::all_of(block.begin() + size, block.end(), [](char c) { return c == '\0'; })) {
    return "GNU long-name header: bytes other than NUL in its padding (tarfile reads them as part "
           "of the name)";
  }
  if (type == 'L') meta.long_name = Field(block.data(), size);
  return "";  // 'K': a link's target, nothing a sample uses
}

}  // namespace

absl::StatusOr<TarScan> ScanTarShard(const std::string& path,
                                      const std::function<absl::Status(uint64_t bytes)>& hold) {
  constexpr size_t kHoldEvery = 4096;
  uint64_t name_bytes = 0;  // the members' names beyond what fits in a std::string
  absl::StatusOr<container::File> file = container::File::Open(path);
  if (!file.ok()) return file.status();
  const int fd = file->fd();
  const uint64_t size = file->size();
  TarScan scan;
  PendingMeta meta;  // from the metadata headers since the last member
  uint64_t offset = 0;
  bool ended = false;
  while (offset < size) {
    char h[kBlock];
    const int64_t got = ReadAt(fd, h, kBlock, offset);
    if (got < 0) return IoError(path, static_cast<int>(-got));
    if (static_cast<uint64_t>(got) < kBlock) {
      scan.stopped = Damaged(path, offset, "truncated", "tar header cut short");
      break;
    }
    if (std::all_of(h, h + kBlock, [](char c) { return c == '\0'; })) {
      ended = true;  // the end marker (a second zero block may follow)
      break;
    }
    uint64_t stored_sum = 0;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < kBlock; ++i) {
      sum += (i >= 148 && i < 156) ? uint64_t{' '} : static_cast<unsigned char>(h[i]);
    }
    if (!ParseOctal(h + 148, 8, &stored_sum) || stored_sum != sum) {
      scan.stopped = Damaged(path, offset, "corrupt",
                             "tar header checksum mismatch: the rest of the shard cannot be read");
      break;
    }
    uint64_t member_size = 0;
    if (!ParseOctal(h + 124, 12, &member_size)) {
      scan.stopped = Damaged(path, offset, "corrupt", "tar header size is not an octal number");
      break;
    }
    const char type = h[156];
    const uint64_t data = offset + kBlock;
    const bool metadata = type == 'L' || type == 'K' || type == 'x' || type == 'g';
    // A pax size replaces the header's for the member after it (not for another metadata header).
    if (!metadata && meta.pax_records.size) member_size = *meta.pax_records.size;
    if (member_size > size - data) {
      scan.stopped = Damaged(path, offset, "truncated",
                             absl::StrCat("member of ", member_size, " bytes runs past the end of "
                                          "the shard (", size - data, " bytes left)"));
      break;
    }
    if (metadata) {  // about the next member
      if (member_size > kMaxMetaBytes) {
        scan.stopped = Damaged(path, offset, "corrupt", "oversized long-name or pax header");
        break;
      }
      if (std::string why = ReadMeta(fd, type, data, member_size, size, meta); !why.empty()) {
        scan.stopped = Damaged(path, offset, why == kCutShort ? "truncated" : "corrupt", why);
        break;
      }
      offset = data + PaddedSize(member_size);
      continue;
    }
    std::string name = Field(h, 100);
    if (NoDataType(type, name)) {
      if (member_size != 0) {
        scan.stopped = Damaged(
            path, offset, "corrupt",
            absl::StrCat("a tar header of type '", std::string(1, type == '\0' ? '0' : type),
                         "' (no data) with a size of ", member_size,
                         ": tar readers disagree where the next header is"));
        break;
      }
    } else if (type == '0' || type == '\0' || type == '7') {  // a regular file
      if (meta.long_name && meta.pax_records.path && *meta.long_name != *meta.pax_records.path) {
        scan.stopped = Damaged(path, offset, "corrupt",
                               "a GNU long name and a pax path name one member differently");
        break;
      }
      if (meta.pax_records.path) {
        name = *meta.pax_records.path;
      } else if (meta.long_name) {
        name = *meta.long_name;
      } else {
        const std::string prefix = Field(h + 345, 155);  // ustar
        if (std::memcmp(h + 257, "ustar", 5) == 0 && !prefix.empty()) name = prefix + "/" + name;
      }
      name_bytes += name.size() > 15 ? name.capacity() : 0;
      scan.members.push_back({std::move(name), data, member_size});
      if (hold && scan.members.size() % kHoldEvery == 0) {
        const uint64_t members = BytesAfterGrowth(scan.members.size(), kHoldEvery,
                                                  scan.members.capacity(), sizeof(TarMember));
        if (absl::Status held = hold(members + name_bytes); !held.ok()) return held;
      }
    }  // other types (GNU extensions and the rest) carry no sample data: skipped, as both do
    meta = PendingMeta{};
    offset = data + PaddedSize(member_size);
  }
  if (!ended && scan.stopped.ok()) {
    scan.stopped = Damaged(path, offset, "truncated", "the shard ends without a tar end marker");
  }
  return scan;
}

std::vector<WebDatasetSample> GroupWebDatasetSamples(const std::vector<TarMember>& members) {
  std::vector<WebDatasetSample> samples;
  for (uint32_t i = 0; i < members.size(); ++i) {
    const std::string& p = members[i].path;
    const size_t slash = p.rfind('/');
    const size_t base = slash == std::string::npos ? 0 : slash + 1;
    const size_t dot = p.find('.', base);
    if (dot == std::string::npos || dot == base) continue;  // no extension, or a hidden file
    std::string key = p.substr(0, dot);
    if (samples.empty() || samples.back().key != key) samples.push_back({std::move(key), {}});
    samples.back().members.emplace_back(p.substr(dot + 1), i);
  }
  return samples;
}

void AppendTarMember(const std::string& path, const std::string& data, std::string& out) {
  char h[kBlock] = {};
  std::memcpy(h, path.data(), std::min<size_t>(path.size(), 100));
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(data.size()));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h + 148, 8, "%06o", sum);  // six digits, NUL, and the space left from above
  h[155] = ' ';
  out.append(h, kBlock);
  out += data;
  out.append(PaddedSize(data.size()) - data.size(), '\0');
}

void AppendTarEnd(std::string& out) { out.append(2 * kBlock, '\0'); }

}  // namespace ringloader::pipeline
