#include "server/pipeline/tar_shard.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

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

// The "path" record of a pax extended header ("<len> path=<value>\n" records).
std::string PaxPath(std::string_view pax) {
  while (!pax.empty()) {
    const size_t space = pax.find(' ');
    if (space == std::string_view::npos) break;
    uint64_t len = 0;
    for (char c : pax.substr(0, space)) {
      if (c < '0' || c > '9') return "";
      len = len * 10 + static_cast<uint64_t>(c - '0');
    }
    if (len <= space + 1 || len > pax.size()) return "";
    std::string_view record = pax.substr(space + 1, len - space - 2);  // without the '\n'
    if (record.substr(0, 5) == "path=") return std::string(record.substr(5));
    pax.remove_prefix(len);
  }
  return "";
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
  std::string long_name;  // from a preceding GNU 'L' or pax 'x' header
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
    if (member_size > size - data) {
      scan.stopped = Damaged(path, offset, "truncated",
                             absl::StrCat("member of ", member_size, " bytes runs past the end of "
                                          "the shard (", size - data, " bytes left)"));
      break;
    }
    if (type == 'L' || type == 'x') {  // metadata for the next member
      if (member_size > kMaxMetaBytes) {
        scan.stopped = Damaged(path, offset, "corrupt", "oversized long-name or pax header");
        break;
      }
      std::string meta(member_size, '\0');
      if (ReadAt(fd, meta.data(), member_size, data) != static_cast<int64_t>(member_size)) {
        scan.stopped = Damaged(path, offset, "truncated", "long-name or pax header cut short");
        break;
      }
      long_name = type == 'L' ? Field(meta.data(), meta.size()) : PaxPath(meta);
    } else if (type == '0' || type == '\0' || type == '7') {  // a regular file
      std::string name = long_name;
      if (name.empty()) {
        name = Field(h, 100);
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
      long_name.clear();
    } else {
      long_name.clear();  // directories, links and the rest carry no sample data
    }
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
