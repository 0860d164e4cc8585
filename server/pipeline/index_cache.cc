// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/index_cache.h"

#include <unistd.h>

#include <fcntl.h>

#include <sys/mman.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
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
  size_t position() const { return pos_; }
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

namespace {

// A read-only private mapping of a whole file, unmapped when the last SampleIndex using it goes.
class Mapping {
 public:
  static std::shared_ptr<const Mapping> Of(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    // Only a regular file is a cache (a directory at its name is not).
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) < kHeaderBytes) {
      ::close(fd);
      return nullptr;
    }
    const size_t bytes = static_cast<size_t>(st.st_size);
    // MAP_POPULATE: the checksum reads every page next; one populate beats a fault per page.
    void* base = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    ::close(fd);
    if (base == MAP_FAILED) return nullptr;
    return std::shared_ptr<const Mapping>(new Mapping(base, bytes));
  }
  ~Mapping() { ::munmap(base_, bytes_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  std::string_view bytes() const { return {static_cast<const char*>(base_), bytes_}; }

 private:
  Mapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  void* base_;
  size_t bytes_;
};

uint64_t PaddingTo8(uint64_t offset) { return (8 - offset % 8) % 8; }

// The per-sample arrays' sizes, in file order.
struct ArraySizes {
  uint64_t path_ends, labels, extents, sample_files, path_blob;
  uint64_t total() const { return path_ends + labels + extents + sample_files + path_blob; }
};

}  // namespace

std::optional<CachedIndex> LoadIndexCache(const std::string& path, const std::string& key) {
  std::shared_ptr<const Mapping> mapping = Mapping::Of(path);
  if (mapping == nullptr) return std::nullopt;
  const std::string_view file = mapping->bytes();
  if (std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0) return std::nullopt;
  Reader header(file.substr(8, kHeaderBytes - 8));
  const uint64_t version_word = header.U64();  // version (low 32) + reserved (high 32)
  const uint64_t payload_bytes = header.U64();
  const uint64_t checksum = header.U64();
  if (static_cast<uint32_t>(version_word) != kIndexCacheVersion) return std::nullopt;
  if (payload_bytes != file.size() - kHeaderBytes) return std::nullopt;
  const std::string_view payload = file.substr(kHeaderBytes);
  if (XXH3_64bits(payload.data(), payload.size()) != checksum) return std::nullopt;

  Reader r(payload);
  if (r.String() != key || !r.ok()) return std::nullopt;
  CachedIndex index;
  SampleList& d = index.description;
  const uint64_t sample_count = r.U64();
  index.fingerprint = r.U64();
  const uint64_t path_blob_bytes = r.U64();
  const uint64_t parts = r.U64();
  const uint64_t has_sample_files = r.U64();
  // Bounds before any multiplication: each array is at most the file.
  if (!r.ok() || sample_count > payload.size() / 16 || path_blob_bytes > payload.size() ||
      parts > 1024 || has_sample_files > 1) {
    return std::nullopt;
  }
  d.parts = static_cast<uint32_t>(parts);
  const uint64_t class_count = r.U64();
  if (!r.ok() || class_count > payload.size()) return std::nullopt;
  for (uint64_t i = 0; i < class_count && r.ok(); ++i) d.class_names.emplace_back(r.String());
  const uint64_t file_count = r.U64();
  if (!r.ok() || file_count > payload.size()) return std::nullopt;
  for (uint64_t i = 0; i < file_count && r.ok(); ++i) d.files.emplace_back(r.String());
  const uint64_t tensor_count = r.U64();
  if (!r.ok() || tensor_count > 1024) return std::nullopt;
  for (uint64_t i = 0; i < tensor_count && r.ok(); ++i) {
    TensorSchema t;
    t.name = std::string(r.String());
    const uint64_t type = r.U64();
    t.ragged = r.U64() != 0;
    const uint64_t rank = r.U64();
    if (type > static_cast<uint64_t>(NpyType::kFloat64) || rank > 32) return std::nullopt;
    // Written by a daemon that let a member take a reserved name: index afresh instead.
    if (!CheckTensorName(t.name, TensorSource::kWebDatasetMember).ok()) return std::nullopt;
    t.type = static_cast<NpyType>(type);
    for (uint64_t dim = 0; dim < rank; ++dim) t.shape.push_back(r.U64());
    d.tensors.push_back(std::move(t));
  }
  const uint64_t problem_count = r.U64();
  if (!r.ok() || problem_count > payload.size()) return std::nullopt;
  for (uint64_t i = 0; i < problem_count && r.ok(); ++i) {
    IndexProblem p;
    p.file = std::string(r.String());
    p.offset = r.U64();
    p.rest_unread = r.U64() != 0;
    p.reason = std::string(r.String());
    p.message = std::string(r.String());
    d.problems.push_back(std::move(p));
  }
  d.ignored_count = r.U64();
  const uint64_t example_count = r.U64();
  if (!r.ok() || example_count > SampleList::kIgnoredExamples) return std::nullopt;
  for (uint64_t i = 0; i < example_count && r.ok(); ++i) {
    d.ignored_examples.push_back(std::string(r.String()));
  }
  const uint64_t note_count = r.U64();
  if (!r.ok() || note_count > 1024) return std::nullopt;
  for (uint64_t i = 0; i < note_count && r.ok(); ++i) d.notes.push_back(std::string(r.String()));
  if (!r.ok()) return std::nullopt;
  // Container formats have files, one per sample, and parts; the others none of them.
  const bool containers = !d.files.empty();
  if ((has_sample_files == 1) != containers || (parts > 0) != containers) return std::nullopt;

  // The arrays: aligned, sized exactly to the end of the file.
  const uint64_t description_end = kHeaderBytes + r.position();
  const uint64_t arrays_at = description_end + PaddingTo8(description_end);
  const ArraySizes sizes{sample_count * 8, sample_count * 8, sample_count * parts * sizeof(Extent),
                         has_sample_files ? sample_count * 4 : 0, path_blob_bytes};
  if (arrays_at > file.size() || file.size() - arrays_at != sizes.total()) return std::nullopt;
  if (file.substr(description_end, arrays_at - description_end).find_first_not_of('\0') !=
      std::string_view::npos) {
    return std::nullopt;
  }
  const char* at = file.data() + arrays_at;  // 8-aligned: the mapping is page-aligned
  const auto take = [&at](uint64_t bytes) {
    const char* begin = at;
    at += bytes;
    return begin;
  };
  const std::span<const uint64_t> path_ends(
      reinterpret_cast<const uint64_t*>(take(sizes.path_ends)), sample_count);
  const std::span<const int64_t> labels(reinterpret_cast<const int64_t*>(take(sizes.labels)),
                                        sample_count);
  const std::span<const Extent> extents(reinterpret_cast<const Extent*>(take(sizes.extents)),
                                        sample_count * parts);
  const std::span<const uint32_t> sample_files(
      reinterpret_cast<const uint32_t*>(take(sizes.sample_files)),
      has_sample_files ? sample_count : 0);
  const std::string_view path_blob(take(sizes.path_blob), path_blob_bytes);

  // The checksum proves the bytes are what we wrote; still check the invariants we rely on, in
  // one pass over the arrays.
  uint64_t prev = 0;
  bool ok = true;
  const bool check_labels = !has_sample_files;  // container formats read labels with the sample
  for (uint64_t i = 0; i < sample_count; ++i) {
    ok &= path_ends[i] > prev || i == 0;
    ok &= !check_labels || static_cast<uint64_t>(labels[i]) < class_count;  // negative: huge
    prev = path_ends[i];
  }
  for (uint32_t f : sample_files) ok &= f < file_count;
  ok &= sample_count == 0 ? path_blob_bytes == 0 : prev == path_blob_bytes;
  if (!ok) return std::nullopt;
  index.samples = SampleIndex::View(std::move(mapping), path_blob, path_ends, labels,
                                    sample_files, d.parts, extents, /*mapped=*/true);
  return index;
}

absl::Status SaveIndexCache(const std::string& path, const std::string& key,
                            const SampleList& description, const SampleIndex& samples,
                            uint64_t fingerprint) {
  const SampleList& d = description;
  const uint64_t n = samples.size();
  const bool has_sample_files = !samples.sample_files().empty();
  std::string meta;
  PutString(meta, key);
  PutU64(meta, n);
  PutU64(meta, fingerprint);
  PutU64(meta, samples.path_blob().size());
  PutU64(meta, samples.parts());
  PutU64(meta, has_sample_files ? 1 : 0);
  PutU64(meta, d.class_names.size());
  for (const std::string& c : d.class_names) PutString(meta, c);
  PutU64(meta, d.files.size());
  for (const std::string& f : d.files) PutString(meta, f);
  PutU64(meta, d.tensors.size());
  for (const TensorSchema& t : d.tensors) {
    PutString(meta, t.name);
    PutU64(meta, static_cast<uint64_t>(t.type));
    PutU64(meta, t.ragged ? 1 : 0);
    PutU64(meta, t.shape.size());
    for (uint64_t dim : t.shape) PutU64(meta, dim);
  }
  PutU64(meta, d.problems.size());
  for (const IndexProblem& p : d.problems) {
    PutString(meta, p.file);
    PutU64(meta, p.offset);
    PutU64(meta, p.rest_unread ? 1 : 0);
    PutString(meta, p.reason);
    PutString(meta, p.message);
  }
  PutU64(meta, d.ignored_count);
  PutU64(meta, d.ignored_examples.size());
  for (const std::string& e : d.ignored_examples) PutString(meta, e);
  PutU64(meta, d.notes.size());
  for (const std::string& note : d.notes) PutString(meta, note);
  meta.append(PaddingTo8(kHeaderBytes + meta.size()), '\0');

  const auto bytes_of = [](auto span) {
    return std::string_view(reinterpret_cast<const char*>(span.data()), span.size_bytes());
  };
  const std::string_view arrays[] = {bytes_of(samples.path_ends()), bytes_of(samples.labels()),
                                     bytes_of(samples.extents()), bytes_of(samples.sample_files()),
                                     samples.path_blob()};
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, meta.data(), meta.size());
  uint64_t payload_bytes = meta.size();
  for (std::string_view a : arrays) {
    XXH3_64bits_update(state, a.data(), a.size());
    payload_bytes += a.size();
  }
  const uint64_t checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);

  std::string header(kMagic, sizeof(kMagic));
  PutU64(header, kIndexCacheVersion);  // version + zero reserved word
  PutU64(header, payload_bytes);
  PutU64(header, checksum);

  const std::filesystem::path target(path);
  std::error_code ec;
  std::filesystem::create_directories(target.parent_path(), ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat(target.parent_path().string(), ": ", ec.message()));
  if (absl::Status s = base::WriteFileAtomically(
          path, {header, meta, arrays[0], arrays[1], arrays[2], arrays[3], arrays[4]});
      !s.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot write index cache: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace ringloader::pipeline
