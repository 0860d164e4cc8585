// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reads one sample's bytes, whatever its dataset's format: the encoded image (and what holding
// it costs, for the memory budget), its label, and each extra tensor straight into its place in
// a batch. Internal to server/pipeline (the BatchFiller and `ringloaderctl validate` use it).
//
// Errors are the sample's: a Status whose message starts with where the sample is (its file, or
// "SHARD#KEY" / "FILE#N" for container formats) and carries a reason (image::ErrorReason):
// read_error, too_large, empty, truncated, crc_mismatch, corrupt (a missing member, a label that
// is not an integer, an .npy whose dtype or shape disagrees with the dataset's).
//
// Not thread-safe; one per sample read. Blocking reads (a slow mount) happen only in
// ReadImageHead, ReadImage, ReadLabel, ReadTensor
// and ReadRest.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/image/sample_file.h"
#include "server/pipeline/container_file.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/io_retry.h"

namespace ringloader::pipeline {

// The encoded image: `bytes` holds it at [offset, offset + size) (a TFRecord keeps the whole
// record around it).
struct ImageBytes {
  std::vector<uint8_t> bytes;
  uint64_t offset = 0;
  uint64_t size = 0;
  std::span<const uint8_t> image() const { return {bytes.data() + offset, size}; }
};

// What a sample holds besides its image: its label and its extra tensors. Read before the
// sample's commit, like the image, so that the decode deadline and the read lane's outage
// handling reach them too (nothing is read after a commit, where no deadline reaches).
struct SampleRest {
  int64_t label = -1;            // stays -1 for a dataset without labels
  std::vector<uint8_t> tensors;  // dataset.tensors() in order, each exactly its SampleBytes()
  std::vector<uint64_t> rows;    // each tensor's first-dimension length
  std::span<const uint8_t> tensor(const Dataset& dataset, uint32_t k) const;
};
// The bytes a SampleRest of `dataset` holds (its tensors'), for the memory budget.
uint64_t RestBytes(const Dataset& dataset);
// Whether a sample of `dataset` has anything besides its image (a label or a tensor).
bool HasRest(const Dataset& dataset);

class SampleReader {
 public:
  // Opens what sample `index` is read from; `max_image_bytes` is the dataset's max_file_bytes
  // (an image file, member or record above it is "too_large", unread).
  // Transient I/O errors (image::IsTransient: EIO, EMFILE, ENOMEM, ...) in Open and every read
  // below are retried with backoff from one budget of `io_retry` for the whole sample
  // (IoRetryBudget); one that outlasts it fails with reason "io_error", saying how long and how
  // often it was tried. `witness` (the read lane's, ReadPool::Witness): failures while the
  // storage answers nothing at all are waited out, not counted. `asked_storage` (if set): as
  // asked_storage() below, for the opening, also when it fails.
  static absl::StatusOr<SampleReader> Open(
      const Dataset& dataset, uint64_t index, uint64_t max_image_bytes,
      std::chrono::milliseconds io_retry = std::chrono::seconds(30),
      std::function<bool(int64_t since_ns)> witness = {}, bool* asked_storage = nullptr);
  SampleReader(SampleReader&&) noexcept = default;
  SampleReader& operator=(SampleReader&&) = delete;
  ~SampleReader() = default;

  // Where the sample is, as error messages start: "/abs/a/b.jpg", "/abs/shard-3.tar#a/b".
  const std::string& where() const { return where_; }
  // What ReadImage() will hold in memory (the image, or its whole record).
  uint64_t read_bytes() const { return read_bytes_; }
  // Whether reading the sample so far sent the storage a request only it could answer: an open
  // (an image file, a shard not kept open yet, an arrays column). False when every byte came
  // through a shard the dataset keeps open: those may be the kernel's cached pages, served while
  // the mount is gone, so they are no sign that it answers (ReadPool::Answer::kUnconfirmed).
  bool asked_storage() const { return asked_storage_; }

  // The image's first bytes (at most `max`), for planning its decode. `*whole` is set when that
  // is all of the image. May return no bytes when the image's start is not within the first
  // `max` bytes of its record: plan for the worst then.
  absl::StatusOr<std::vector<uint8_t>> ReadImageHead(uint64_t max, bool* whole);
  absl::StatusOr<ImageBytes> ReadImage();
  // The label: the dataset's (imagefolder, manifest), the label member (webdataset), the
  // record's (tfrecord: read again unless ReadImage() read it), the label column's row (arrays).
  absl::StatusOr<int64_t> ReadLabel();
  // dataset.tensors()[k] of this sample into `out` (exactly its SampleBytes()). Returns the
  // sample's first-dimension length (ragged tensors are zero-padded up to the schema's).
  absl::StatusOr<uint64_t> ReadTensor(uint32_t k, std::span<uint8_t> out);
  // The label (if the dataset has labels) and every tensor, into a SampleRest of RestBytes().
  absl::StatusOr<SampleRest> ReadRest();

 private:
  SampleReader(const Dataset& dataset, uint64_t index) : dataset_(&dataset), index_(index) {}
  // Sets `*asked` when it opened a file (whatever came of it).
  static absl::StatusOr<SampleReader> OpenOnce(const Dataset& dataset, uint64_t index,
                                               uint64_t max_image_bytes, bool* asked);
  absl::StatusOr<std::vector<uint8_t>> ReadImageHeadOnce(uint64_t max, bool* whole);
  absl::StatusOr<ImageBytes> ReadImageOnce();
  absl::StatusOr<int64_t> ReadLabelOnce();
  absl::StatusOr<uint64_t> ReadTensorOnce(uint32_t k, std::span<uint8_t> out);
  absl::Status ReadMember(Extent extent, const char* what, uint64_t max, std::string& out);
  absl::Status Damaged(std::string_view reason, const std::string& what) const;

  const Dataset* dataset_;
  uint64_t index_;
  IoRetryBudget budget_{std::chrono::milliseconds(0)};  // Open's, with what it left
  std::string where_;
  uint64_t read_bytes_ = 0;
  std::optional<image::SampleFile> file_;             // imagefolder, manifest
  std::shared_ptr<const container::File> container_;  // webdataset, tfrecord (shared)
  std::string container_path_;
  std::optional<int64_t> record_label_;  // tfrecord, after ReadImage
  bool asked_storage_ = false;
};

}  // namespace ringloader::pipeline
