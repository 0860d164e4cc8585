// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/dataset.h"

#include <catch2/catch.hpp>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;
using testing::WriteFile;

std::vector<std::string> Paths(const Dataset& ds) {
  std::vector<std::string> out;
  for (uint64_t i = 0; i < ds.size(); ++i) out.emplace_back(ds.relative_path(i));
  return out;
}
std::vector<int64_t> Labels(const Dataset& ds) {
  std::vector<int64_t> out;
  for (uint64_t i = 0; i < ds.size(); ++i) out.push_back(ds.label(i));
  return out;
}

// The index cache is only written for trees older than a few seconds (see dataset.cc), so tests
// that want it move the folder mtimes an hour back, as if the dataset had been copied long ago.
void SetMtime(const fs::path& p, std::chrono::seconds age) {
  fs::last_write_time(p, fs::file_time_type::clock::now() - age);
}
void Backdate(const std::string& root) {
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    if (e.is_directory()) SetMtime(e.path(), std::chrono::hours(1));
  }
  SetMtime(root, std::chrono::hours(1));
}

// bird/z.Jpg, cat/{x.jpg,y.PNG} (+ a hidden image and a text file),
// dog/{b.jpg,a.JPEG,d.webp,e.gif,sub/c.jpeg}, a hidden class folder and a stray file at the
// root. Contents do not matter: Dataset never decodes.
void MakeTree(const std::string& root) {
  for (const char* d : {"bird", "cat", "dog/sub", ".hidden_class"}) {
    fs::create_directories(fs::path(root) / d);
  }
  for (const char* f : {"bird/z.Jpg", "cat/x.jpg", "cat/y.PNG", "cat/.hidden.jpg", "cat/notes.txt",
                        "dog/b.jpg", "dog/a.JPEG", "dog/d.webp", "dog/e.gif", "dog/sub/c.jpeg",
                        ".hidden_class/y.jpg", "stray.jpg"}) {
    WriteFile(root + "/" + f, "x");
  }
}

DatasetSpec FolderSpec(const std::string& root, const std::string& state_dir = "") {
  DatasetSpec spec;
  spec.name = "folder";
  spec.format = DatasetFormat::kImageFolder;
  spec.root = root;
  spec.state_dir = state_dir;
  return spec;
}

DatasetSpec ManifestSpec(const std::string& root, const std::string& manifest) {
  DatasetSpec spec;
  spec.name = "man";
  spec.format = DatasetFormat::kManifest;
  spec.root = root;
  spec.manifest_path = manifest;
  return spec;
}

// A backdated tree (old enough for its index cache to be written) and the dataset that the first
// Open() walked, writing the cache.
struct CachedTree {
  TempDir dir;
  TempDir state;
  std::unique_ptr<Dataset> walked;

  CachedTree() {
    MakeTree(dir.path());
    Backdate(dir.path());
    walked = Open();
  }
  std::unique_ptr<Dataset> Open() const {
    absl::StatusOr<std::unique_ptr<Dataset>> ds = Dataset::Open(FolderSpec(dir.path(), state.path()));
    REQUIRE(ds.ok());
    return *std::move(ds);
  }
  fs::path CacheFile() const {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(state.path())) files.push_back(e);
    REQUIRE(files.size() == 1);
    return files[0];
  }
};

TEST_CASE("Dataset: imagefolder lists what torchvision's ImageFolder lists: its extensions in any "
          "case, hidden names too, sorted, with other files counted and named",
          "[pipeline]") {
  TempDir dir;
  MakeTree(dir.path());
  auto ds = Dataset::Open(FolderSpec(dir.path()));
  REQUIRE(ds.ok());
  CHECK((*ds)->class_names() == std::vector<std::string>{".hidden_class", "bird", "cat", "dog"});
  CHECK(Paths(**ds) == std::vector<std::string>{".hidden_class/y.jpg", "bird/z.Jpg",
                                                "cat/.hidden.jpg", "cat/x.jpg", "cat/y.PNG",
                                                "dog/a.JPEG", "dog/b.jpg", "dog/d.webp",
                                                "dog/sub/c.jpeg"});
  CHECK(Labels(**ds) == std::vector<int64_t>{0, 1, 2, 2, 2, 3, 3, 3, 3});
  CHECK((*ds)->AbsolutePath(3) == dir.path() + "/cat/x.jpg");
  CHECK_FALSE((*ds)->loaded_from_cache());
  // The stray file at the root belongs to no class: torchvision never sees it either.
  CHECK((*ds)->ignored_count() == 2);
  CHECK((*ds)->ignored_examples() == std::vector<std::string>{"cat/notes.txt", "dog/e.gif"});
  CHECK((*ds)->IgnoredText() == "ignored 2 files without an image extension, e.g. cat/notes.txt");
}

TEST_CASE("Dataset: an imagefolder class folder without a single image is an error naming it, "
          "as in torchvision",
          "[pipeline]") {
  TempDir dir;
  MakeTree(dir.path());
  fs::create_directories(dir.Join("empty"));
  fs::create_directories(dir.Join("text_only"));
  WriteFile(dir.Join("text_only/README.txt"), "x");
  auto ds = Dataset::Open(FolderSpec(dir.path()));
  REQUIRE_FALSE(ds.ok());
  CHECK_THAT(std::string(ds.status().message()),
             Catch::Contains("dataset 'folder'") &&
                 Catch::Contains("no file with an image extension in the class folders empty, "
                                 "text_only") &&
                 Catch::Contains(".png"));
}

TEST_CASE("Dataset: imagefolder follows symlinked files and folders like torchvision, with "
          "loop protection",
          "[pipeline]") {
  TempDir dir;
  TempDir outside;
  MakeTree(dir.path());
  WriteFile(outside.Join("secret.jpg"), "x");
  fs::create_directories(outside.Join("more"));
  WriteFile(outside.Join("more/m.jpg"), "x");
  fs::create_symlink(outside.Join("secret.jpg"), dir.Join("cat/leak.jpg"));
  fs::create_directory_symlink(outside.Join("more"), dir.Join("cat/more"));
  fs::create_directory_symlink(outside.Join("more"), dir.Join("linked_class"));
  fs::create_symlink(dir.Join("bird/z.Jpg"), dir.Join("cat/inside.jpg"));
  // A loop: dog/sub/up is dog itself. Entered once (as dog), never again through the link.
  fs::create_directory_symlink(dir.Join("dog"), dir.Join("dog/sub/up"));
  fs::create_directory_symlink(dir.Join("dog/sub"), dir.Join("dog/sub/self"));
  auto ds = Dataset::Open(FolderSpec(dir.path()));
  REQUIRE(ds.ok());
  // torchvision: classes = scandir is_dir() (symlinks followed), files = sorted(os.walk(
  // followlinks=True)): folder by folder in path order, each folder's files sorted.
  CHECK((*ds)->class_names() ==
        std::vector<std::string>{".hidden_class", "bird", "cat", "dog", "linked_class"});
  CHECK(Paths(**ds) == std::vector<std::string>{".hidden_class/y.jpg", "bird/z.Jpg",
                                                "cat/.hidden.jpg", "cat/inside.jpg",
                                                "cat/leak.jpg", "cat/x.jpg", "cat/y.PNG",
                                                "cat/more/m.jpg", "dog/a.JPEG", "dog/b.jpg",
                                                "dog/d.webp", "dog/sub/c.jpeg",
                                                "linked_class/m.jpg"});
  CHECK((*ds)->label(12) == 4);
}

TEST_CASE("Dataset: the index cache is used on reopen and rebuilt when a class folder changes",
          "[pipeline]") {
  CachedTree tree;
  const Dataset& first = *tree.walked;
  CHECK_FALSE(first.loaded_from_cache());

  const std::unique_ptr<Dataset> second = tree.Open();
  CHECK(second->loaded_from_cache());
  CHECK(Paths(*second) == Paths(first));
  CHECK(Labels(*second) == Labels(first));
  CHECK(second->class_names() == first.class_names());
  CHECK(second->ignored_count() == 2);
  CHECK(second->ignored_examples() == first.ignored_examples());

  WriteFile(tree.dir.Join("cat/w.jpg"), "x");
  SetMtime(tree.dir.Join("cat"), std::chrono::minutes(30));  // what the kernel does, made explicit
  const std::unique_ptr<Dataset> third = tree.Open();
  CHECK_FALSE(third->loaded_from_cache());
  CHECK(Paths(*third)[3] == "cat/w.jpg");
  CHECK(third->size() == first.size() + 1);

  const std::unique_ptr<Dataset> fourth = tree.Open();
  CHECK(fourth->loaded_from_cache());
  CHECK(Paths(*fourth) == Paths(*third));
}

// True when this process maps `path`; `deleted`: the mapping of a file since replaced.
bool Mapped(const fs::path& path, bool deleted = false) {
  std::ifstream maps("/proc/self/maps");
  const std::string name = path.string() + (deleted ? " (deleted)" : "");
  for (std::string line; std::getline(maps, line);) {
    if (line.size() >= name.size() && line.compare(line.size() - name.size(), name.size(), name) == 0) {
      return true;
    }
  }
  return false;
}

TEST_CASE("13.3: a reopened dataset uses its index cache file mapped in place, which stays valid "
          "while a newer cache replaces the file",
          "[pipeline]") {
  CachedTree tree;
  const Dataset& walked = *tree.walked;
  const fs::path cache = tree.CacheFile();
  CHECK_FALSE(Mapped(cache));  // written, not mapped: the walked dataset keeps its own arrays

  std::unique_ptr<Dataset> mapped = tree.Open();
  CHECK(mapped->loaded_from_cache());
  CHECK(Mapped(cache));
  CHECK(mapped->fingerprint() == walked.fingerprint());  // stored, not recomputed
  CHECK(Paths(*mapped) == Paths(walked));
  CHECK(Labels(*mapped) == Labels(walked));
  CHECK(mapped->MemoryBytes() == walked.MemoryBytes());

  // A new class folder: the next Open walks and renames a new cache over the mapped one.
  fs::create_directories(tree.dir.Join("eel"));
  WriteFile(tree.dir.Join("eel/e.jpg"), "x");
  Backdate(tree.dir.path());
  const std::unique_ptr<Dataset> rewalked = tree.Open();
  CHECK_FALSE(rewalked->loaded_from_cache());
  CHECK(rewalked->size() == walked.size() + 1);
  CHECK(Mapped(cache, /*deleted=*/true));  // the old file lives on while mapped
  CHECK(Paths(*mapped) == Paths(walked));
  CHECK(mapped->fingerprint() != rewalked->fingerprint());

  mapped.reset();
  CHECK_FALSE(Mapped(cache, /*deleted=*/true));
  const std::unique_ptr<Dataset> remapped = tree.Open();
  CHECK(remapped->loaded_from_cache());
  CHECK(Paths(*remapped) == Paths(*rewalked));
  CHECK(remapped->fingerprint() == rewalked->fingerprint());
}

TEST_CASE("Dataset: a corrupt or truncated index cache is ignored and rewritten", "[pipeline]") {
  CachedTree tree;
  const Dataset& fresh = *tree.walked;
  const fs::path cache = tree.CacheFile();
  const std::string good = testing::ReadFile(cache);
  // The on-disk header is pinned with literal numbers: if this fails, bump kIndexCacheVersion.
  REQUIRE(good.size() > 32);
  CHECK(good.substr(0, 8) == std::string("RLINDEX\0", 8));
  CHECK(good.substr(8, 8) == std::string("\x05\0\0\0\0\0\0\0", 8));  // version 5, reserved 0
  uint64_t payload_bytes = 0;
  std::memcpy(&payload_bytes, good.data() + 16, 8);
  CHECK(payload_bytes == good.size() - 32);
  CHECK_THAT(cache.filename().string(),
             Catch::StartsWith("imagefolder-") && Catch::EndsWith(".index"));

  // The last label (dog's, 3 of 4 classes) is followed by nothing but the paths, stored last;
  // flipped it is another valid label: only the checksum can tell.
  uint64_t path_bytes = 0;
  for (const std::string& p : Paths(fresh)) path_bytes += p.size();
  std::string flipped = good;
  CHECK(flipped[good.size() - path_bytes - 8] == 3);
  flipped[good.size() - path_bytes - 8] ^= 0x01;
  std::string renamed = good;  // a path's byte: "dog/..." becomes "eog/...", still sorted
  renamed[good.size() - path_bytes + good.substr(good.size() - path_bytes).find("dog/")] = 'e';
  for (const std::string& bad :
       {flipped, renamed, good.substr(0, good.size() / 2), good.substr(0, 32), std::string()}) {
    WriteFile(cache, bad);
    const std::unique_ptr<Dataset> reopened = tree.Open();
    CHECK_FALSE(reopened->loaded_from_cache());
    CHECK(Labels(*reopened) == Labels(fresh));
    CHECK(testing::ReadFile(cache) == good);  // rewritten
  }
}

// `file` with a fresh payload checksum (header bytes 24..32), as a writer with a bug would sign it.
std::string Resigned(std::string file) {
  const uint64_t sum = XXH3_64bits(file.data() + 32, file.size() - 32);
  std::memcpy(file.data() + 24, &sum, 8);
  return file;
}
template <typename T>
void Put(std::string& file, size_t offset, T value) {
  std::memcpy(file.data() + offset, &value, sizeof(T));
}

TEST_CASE("13.3: an index cache whose checksum holds but whose contents break an invariant is "
          "ignored and rewritten",
          "[pipeline]") {
  CachedTree tree;
  const Dataset& fresh = *tree.walked;
  const fs::path cache = tree.CacheFile();
  const std::string good = testing::ReadFile(cache);
  REQUIRE(tree.Open()->loaded_from_cache());

  // Offsets from index_cache.h: the description starts with the key, then five words.
  uint64_t key_bytes = 0;
  std::memcpy(&key_bytes, good.data() + 32, 8);
  const size_t words = 32 + 8 + key_bytes;  // sample_count, fingerprint, blob, parts, has_files
  const uint64_t n = fresh.size();
  uint64_t blob = 0;
  for (const std::string& p : Paths(fresh)) blob += p.size();
  const size_t path_ends = good.size() - blob - 16 * n;  // then labels, then the paths
  const size_t labels = path_ends + 8 * n;

  std::vector<std::pair<std::string, std::string>> broken;
  std::string f = good;
  Put<uint64_t>(f, path_ends + 8, 0);  // sample 1's path ends before sample 0's
  broken.emplace_back("path_ends not ascending", f);
  f = good;
  Put<int64_t>(f, labels, 4);  // 4 classes: labels 0..3
  broken.emplace_back("label out of range", f);
  f = good;
  Put<int64_t>(f, labels, -1);
  broken.emplace_back("negative label", f);
  f = good;
  Put<uint64_t>(f, words, n + 1);
  broken.emplace_back("sample count not what the file holds", f);
  f = good;
  Put<uint64_t>(f, words, uint64_t{1} << 61);
  broken.emplace_back("sample count beyond any file", f);
  f = good;
  Put<uint64_t>(f, words + 24, 1);
  broken.emplace_back("parts without container files", f);
  f = good;
  Put<uint64_t>(f, words + 32, 1);
  broken.emplace_back("sample files without container files", f);
  f = good;
  Put<uint64_t>(f, words + 16, blob + 8);
  broken.emplace_back("path blob longer than the file", f);
  for (const auto& [what, bytes] : broken) {
    INFO(what);
    testing::WriteFile(cache, Resigned(bytes));
    const std::unique_ptr<Dataset> reopened = tree.Open();
    CHECK_FALSE(reopened->loaded_from_cache());
    CHECK(Paths(*reopened) == Paths(fresh));
    CHECK(Labels(*reopened) == Labels(fresh));
    CHECK(testing::ReadFile(cache) == good);  // rewritten
  }
  testing::WriteFile(cache, Resigned(good));  // re-signing alone changes nothing
  CHECK(tree.Open()->loaded_from_cache());
}

TEST_CASE("Dataset: no cache is written for a tree that changed in the last seconds",
          "[pipeline]") {
  TempDir dir;
  TempDir state;
  MakeTree(dir.path());  // just created: a file added in the same mtime tick could be missed
  REQUIRE(Dataset::Open(FolderSpec(dir.path(), state.path())).ok());
  auto again = Dataset::Open(FolderSpec(dir.path(), state.path()));
  REQUIRE(again.ok());
  CHECK_FALSE((*again)->loaded_from_cache());
}

TEST_CASE("Dataset: manifest CSV and TSV, with and without a header", "[pipeline]") {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a.csv", "path,label\nx/1.jpg,3\ny/2.jpg,0\n"},
      {"b.csv", "x/1.jpg,3\r\n\r\ny/2.jpg, 0\r\n"},
      {"c.tsv", "relative_path\tlabel\nx/1.jpg\t3\ny/2.jpg\t0"},
      {"d.tsv", "x/1.jpg\t3\ny/2.jpg\t0\n"},
  };
  for (const auto& [name, text] : cases) {
    WriteFile(dir.Join(name), text);
    auto ds = Dataset::Open(ManifestSpec(dir.path(), dir.Join(name)));
    INFO(name);
    REQUIRE(ds.ok());
    CHECK(Paths(**ds) == std::vector<std::string>{"x/1.jpg", "y/2.jpg"});
    CHECK(Labels(**ds) == std::vector<int64_t>{3, 0});
    CHECK((*ds)->class_names().empty());
  }
  WriteFile(dir.Join("e.csv"), "\"a,b \"\"c\"\".jpg\",1\nd,e.jpg,2\n");
  auto quoted = Dataset::Open(ManifestSpec(dir.path(), dir.Join("e.csv")));
  REQUIRE(quoted.ok());
  CHECK(Paths(**quoted) == std::vector<std::string>{"a,b \"c\".jpg", "d,e.jpg"});
}

TEST_CASE("Dataset: errors name the dataset, the file and the line", "[pipeline]") {
  TempDir dir;
  auto missing = Dataset::Open(FolderSpec(dir.Join("nope")));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("dataset 'folder'") && Catch::Contains(dir.Join("nope")));

  fs::create_directories(dir.Join("empty_root/cls"));
  auto empty = Dataset::Open(FolderSpec(dir.Join("empty_root")));
  REQUIRE_FALSE(empty.ok());
  CHECK_THAT(std::string(empty.status().message()),
             Catch::Contains("no file with an image extension in the class folder cls"));

  const std::string m = dir.Join("m.csv");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"path,label\na.jpg,1\nb.jpg,cat\n", m + ":3: label must be an integer >= 0"},
      {"a.jpg,1\nb.jpg,-2\n", m + ":2: label must be an integer >= 0"},
      {"a.jpg,1\n../b.jpg,2\n", m + ":2: path escapes the root"},
      {"a.jpg,1\nx/../../b.jpg,2\n", m + ":2: path escapes the root"},
      {"a.jpg,1\n\n/etc/b.jpg,2\n", m + ":3: path must be relative"},
      {"a.jpg,1\nb.jpg\n", m + ":2: expected"},
      {"path,label\n", "no samples"},
  };
  for (const auto& [text, expected] : cases) {
    WriteFile(m, text);
    auto ds = Dataset::Open(ManifestSpec(dir.path(), m));
    INFO(text);
    REQUIRE_FALSE(ds.ok());
    CHECK_THAT(std::string(ds.status().message()),
               Catch::Contains(expected) && Catch::Contains("dataset 'man'"));
  }
  auto no_manifest = Dataset::Open(ManifestSpec(dir.path(), dir.Join("absent.csv")));
  REQUIRE_FALSE(no_manifest.ok());
  CHECK_THAT(std::string(no_manifest.status().message()), Catch::Contains(dir.Join("absent.csv")));
}

TEST_CASE("Dataset: a manifest of a million samples opens and stays compact", "[pipeline]") {
  constexpr uint64_t kSamples = 1'000'000;
  TempDir dir;
  {
    std::string text = "path,label\n";
    text.reserve(kSamples * 32);
    char line[64];
    for (uint64_t i = 0; i < kSamples; ++i) {
      const int n = std::snprintf(line, sizeof(line), "n%04llu/img_%07llu.JPEG,%llu\n",
                                  static_cast<unsigned long long>(i % 1000),
                                  static_cast<unsigned long long>(i),
                                  static_cast<unsigned long long>(i % 1000));
      text.append(line, static_cast<size_t>(n));
    }
    WriteFile(dir.Join("big.csv"), text);
  }
  auto ds = Dataset::Open(ManifestSpec(dir.path(), dir.Join("big.csv")));
  REQUIRE(ds.ok());
  REQUIRE((*ds)->size() == kSamples);
  CHECK((*ds)->relative_path(0) == "n0000/img_0000000.JPEG");
  CHECK((*ds)->relative_path(kSamples - 1) == "n0999/img_0999999.JPEG");
  CHECK((*ds)->label(kSamples - 1) == 999);
  CHECK((*ds)->MemoryBytes() > kSamples * 16);   // it does count the arrays
  CHECK((*ds)->MemoryBytes() < kSamples * 100);  // no per-sample std::string
}

}  // namespace
}  // namespace ringloader::pipeline
