#include "server/pipeline/index_cache.h"

#include <unistd.h>

#include <fcntl.h>

#include <sys/stat.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shm/base/atomic_file.h"

namespace ringloader::pipeline {
namespace {

constexpr char kMagic[8] = {'R', 'L', 'I', 'N', 'D', 'E', 'X', '\0'};
constexpr size_t kHeaderBytes = 32;
static_assert(sizeof(Extent) == 16 && std::is_trivially_copyable_v<Extent>, "stored as bytes");

void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
void PutString(std::string& out, std::string_view s) {
  PutU64(out, s.size());
  out.append(s);
}

// Bounds-checked reader over the payload; any overrun makes ok() false.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool ok() const { return ok_; }
  bool done() const { return pos_ == data_.size(); }
  uint64_t U64() {
    uint64_t v = 0;
    if (!Need(8)) return 0;
    std::memcpy(&v, data_.data() + pos_, 8);
    pos_ += 8;
    return v;
  }
  std::string_view Bytes(uint64_t n) {
    if (!Need(n)) return {};
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string_view String() { return Bytes(U64()); }
  // Reads n fixed-width values into `out` (n bounded by the remaining bytes first).
  template <typename T>
  void Array(uint64_t n, std::vector<T>& out) {
    if (n > (data_.size() - pos_) / sizeof(T)) {
      ok_ = false;
      return;
    }
    out.resize(n);
    if (n == 0) return;  // memcpy of nothing into an empty vector's null data() is still UB
    std::memcpy(out.data(), data_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
  }

 private:
  bool Need(uint64_t n) {
    if (!ok_ || n > data_.size() - pos_) ok_ = false;
    return ok_;
  }
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace

std::string IndexCachePath(const std::string& state_dir, const std::string& kind,
                           const std::string& identity) {
  const uint64_t h = XXH3_64bits(identity.data(), identity.size());
  return absl::StrFormat("%s/%s-%016x.index", state_dir, kind, h);
}

std::optional<SampleList> LoadIndexCache(const std::string& path, const std::string& key) {
  // Only a regular file is a cache (a directory at its name made the stream read throw).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  // One read of the whole file (a 1.28M-sample index is ~50 MB: a byte-at-a-time stream read
  // took most of a restart's 160 ms).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string file;
  try {
    file.resize(static_cast<size_t>(st.st_size));
  } catch (const std::exception&) {
    ::close(fd);
    return std::nullopt;
  }
  size_t got = 0;
  while (got < file.size()) {
    const ssize_t n = ::read(fd, file.data() + got, file.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != file.size() || file.size() < kHeaderBytes) return std::nullopt;
  if (std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0) return std::nullopt;
  Reader header(std::string_view(file).substr(8, kHeaderBytes - 8));
  const uint64_t version_word = header.U64();  // version (low 32) + reserved (high 32)
  const uint64_t payload_bytes = header.U64();
  const uint64_t checksum = header.U64();
  if (static_cast<uint32_t>(version_word) != kIndexCacheVersion) return std::nullopt;
  if (payload_bytes != file.size() - kHeaderBytes) return std::nullopt;
  const std::string_view payload = std::string_view(file).substr(kHeaderBytes);
  if (XXH3_64bits(payload.data(), payload.size()) != checksum) return std::nullopt;

  Reader r(payload);
  if (r.String() != key || !r.ok()) return std::nullopt;
  SampleList list;
  const uint64_t class_count = r.U64();
  if (!r.ok() || class_count > payload.size()) return std::nullopt;
  for (uint64_t i = 0; i < class_count && r.ok(); ++i) list.class_names.emplace_back(r.String());
  const uint64_t sample_count = r.U64();
  list.path_blob = std::string(r.String());
  r.Array(sample_count, list.path_ends);
  r.Array(sample_count, list.labels);
  const uint64_t file_count = r.U64();
  if (!r.ok() || file_count > payload.size()) return std::nullopt;
  for (uint64_t i = 0; i < file_count && r.ok(); ++i) list.files.emplace_back(r.String());
  r.Array(file_count == 0 ? 0 : sample_count, list.sample_files);
  const uint64_t parts = r.U64();
  if (!r.ok() || parts > 1024) return std::nullopt;
  list.parts = static_cast<uint32_t>(parts);
  r.Array(sample_count * parts, list.extents);
  const uint64_t tensor_count = r.U64();
  if (!r.ok() || tensor_count > 1024) return std::nullopt;
  for (uint64_t i = 0; i < tensor_count && r.ok(); ++i) {
    TensorSchema t;
    t.name = std::string(r.String());
    const uint64_t type = r.U64();
    t.ragged = r.U64() != 0;
    const uint64_t rank = r.U64();
    if (type > static_cast<uint64_t>(NpyType::kFloat64) || rank > 32) return std::nullopt;
    t.type = static_cast<NpyType>(type);
    for (uint64_t d = 0; d < rank; ++d) t.shape.push_back(r.U64());
    list.tensors.push_back(std::move(t));
  }
  const uint64_t problem_count = r.U64();
  if (!r.ok() || problem_count > payload.size()) return std::nullopt;
  for (uint64_t i = 0; i < problem_count && r.ok(); ++i) {
    IndexProblem p;
    p.file = std::string(r.String());
    p.offset = r.U64();
    p.reason = std::string(r.String());
    p.message = std::string(r.String());
    list.problems.push_back(std::move(p));
  }
  list.ignored_count = r.U64();
  const uint64_t example_count = r.U64();
  if (!r.ok() || example_count > SampleList::kIgnoredExamples) return std::nullopt;
  for (uint64_t i = 0; i < example_count && r.ok(); ++i) {
    list.ignored_examples.push_back(std::string(r.String()));
  }
  if (!r.ok() || !r.done()) return std::nullopt;
  if (parts > 0 && list.files.empty()) return std::nullopt;
  for (uint32_t f : list.sample_files) {
    if (f >= list.files.size()) return std::nullopt;
  }
  // The checksum proves the bytes are what we wrote; still check the invariants we rely on.
  uint64_t prev = 0;
  for (uint64_t i = 0; i < sample_count; ++i) {
    if (list.path_ends[i] <= prev && i > 0) return std::nullopt;
    if (list.path_ends[i] > list.path_blob.size()) return std::nullopt;
    if (file_count == 0 &&  // container formats read labels with the sample (-1 here)
        (list.labels[i] < 0 || static_cast<uint64_t>(list.labels[i]) >= class_count)) {
      return std::nullopt;
    }
    prev = list.path_ends[i];
  }
  if (sample_count > 0 && list.path_ends.back() != list.path_blob.size()) return std::nullopt;
  return list;
}

absl::Status SaveIndexCache(const std::string& path, const std::string& key,
                            const SampleList& list) {
  std::string payload;
  payload.reserve(key.size() + list.path_blob.size() + list.size() * 16 + 64);
  PutString(payload, key);
  PutU64(payload, list.class_names.size());
  for (const std::string& c : list.class_names) PutString(payload, c);
  PutU64(payload, list.size());
  PutString(payload, list.path_blob);
  payload.append(reinterpret_cast<const char*>(list.path_ends.data()), list.size() * 8);
  payload.append(reinterpret_cast<const char*>(list.labels.data()), list.size() * 8);
  PutU64(payload, list.files.size());
  for (const std::string& f : list.files) PutString(payload, f);
  if (!list.files.empty()) {
    payload.append(reinterpret_cast<const char*>(list.sample_files.data()),
                   list.sample_files.size() * sizeof(uint32_t));
  }
  PutU64(payload, list.parts);
  payload.append(reinterpret_cast<const char*>(list.extents.data()),
                 list.extents.size() * sizeof(Extent));
  PutU64(payload, list.tensors.size());
  for (const TensorSchema& t : list.tensors) {
    PutString(payload, t.name);
    PutU64(payload, static_cast<uint64_t>(t.type));
    PutU64(payload, t.ragged ? 1 : 0);
    PutU64(payload, t.shape.size());
    for (uint64_t d : t.shape) PutU64(payload, d);
  }
  PutU64(payload, list.problems.size());
  for (const IndexProblem& p : list.problems) {
    PutString(payload, p.file);
    PutU64(payload, p.offset);
    PutString(payload, p.reason);
    PutString(payload, p.message);
  }
  PutU64(payload, list.ignored_count);
  PutU64(payload, list.ignored_examples.size());
  for (const std::string& e : list.ignored_examples) PutString(payload, e);

  std::string header(kMagic, sizeof(kMagic));
  PutU64(header, kIndexCacheVersion);  // version + zero reserved word
  PutU64(header, payload.size());
  PutU64(header, XXH3_64bits(payload.data(), payload.size()));

  const std::filesystem::path target(path);
  std::error_code ec;
  std::filesystem::create_directories(target.parent_path(), ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat(target.parent_path().string(), ": ", ec.message()));
  if (absl::Status s = base::WriteFileAtomically(path, {header, payload}); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot write index cache: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace ringloader::pipeline
