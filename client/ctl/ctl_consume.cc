// SPDX-License-Identifier: Apache-2.0
// ringloaderctl consume: reads batches like a trainer (see ctl.h for the contract).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/ctl/consume_state.h"
#include "client/ctl/ctl.h"
#include "client/ctl/samples_out.h"
#include "shm/base/atomic_file.h"

namespace ringloader::ctl {
namespace {

using Clock = std::chrono::steady_clock;

// The --samples-out file, opened for appending at a known byte length.
class SamplesOut {
 public:
  // Opens `path` keeping its first `keep_bytes` bytes (0 = start afresh). Fails if the file is
  // shorter than `keep_bytes` (it is not the file the state was saved with).
  static absl::StatusOr<std::unique_ptr<SamplesOut>> Open(const std::string& path,
                                                          uint64_t keep_bytes) {
    std::FILE* f = std::fopen(path.c_str(), keep_bytes == 0 ? "wb" : "r+b");
    if (f == nullptr) {
      return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    }
    auto out = std::unique_ptr<SamplesOut>(new SamplesOut(path, f));
    if (keep_bytes > 0) {
      if (std::fseek(f, 0, SEEK_END) != 0) return out->Errno("seek");
      const long size = std::ftell(f);
      if (size < 0) return out->Errno("ftell");
      if (static_cast<uint64_t>(size) < keep_bytes) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, " has ", size, " bytes but the state file records ", keep_bytes,
                         ": it is not the samples file of that run"));
      }
      // Lines after keep_bytes were written after the last saved state: they will be delivered
      // again, so drop them.
      if (ftruncate(fileno(f), static_cast<off_t>(keep_bytes)) != 0) return out->Errno("truncate");
      if (std::fseek(f, 0, SEEK_END) != 0) return out->Errno("seek");
    }
    out->bytes_ = keep_bytes;
    return out;
  }
  ~SamplesOut() { std::fclose(file_); }

  absl::Status Append(absl::string_view text) {
    if (std::fwrite(text.data(), 1, text.size(), file_) != text.size()) return Errno("write");
    bytes_ += text.size();
    return absl::OkStatus();
  }
  // Hands the lines to the kernel (no fsync: surviving our own death is enough).
  absl::Status Flush() { return std::fflush(file_) == 0 ? absl::OkStatus() : Errno("flush"); }
  uint64_t bytes() const { return bytes_; }

 private:
  SamplesOut(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status Errno(absl::string_view what) const {
    return absl::InternalError(absl::StrCat(what, " ", path_, ": ", std::strerror(errno)));
  }
  std::string path_;
  std::FILE* file_;
  uint64_t bytes_ = 0;
};

// "\repoch 1/2 [#######-------------] 35%  batches 41/118  1532.2 images/s  ETA 0:05": where
// the run is, in batches of the whole run (the daemon's count per epoch; an upper bound when
// samples are skipped).
std::string ProgressLine(const client::Batch& batch, const client::Stream& stream, uint64_t epochs,
                         uint64_t batches_done, double images_per_second) {
  const uint64_t per_epoch = std::max<uint64_t>(1, stream.batches_per_epoch());
  const uint64_t total = per_epoch * std::max<uint64_t>(1, epochs);
  // Counted from the position, so a resumed run shows the whole run's progress.
  const uint64_t done = std::min(total, batch.position().epoch * per_epoch +
                                            batch.position().sequence + 1);
  const double fraction = static_cast<double>(done) / static_cast<double>(total);
  constexpr int kWidth = 20;
  const int filled = static_cast<int>(fraction * kWidth);
  const double per_batch = batches_done > 0 && images_per_second > 0
                               ? static_cast<double>(stream.options().batch_size) / images_per_second
                               : 0;
  const auto eta = static_cast<uint64_t>(per_batch * static_cast<double>(total - done));
  return absl::StrFormat("\repoch %d/%d [%s%s] %3d%%  batches %d/%d  %.1f images/s  ETA %d:%02d   ",
                         batch.position().epoch + 1, std::max<uint64_t>(1, epochs),
                         std::string(filled, '#'), std::string(kWidth - filled, '-'),
                         static_cast<int>(fraction * 100), done, total, images_per_second,
                         eta / 60, eta % 60);
}


// Everything after the flags are checked; throws client::Error, returns a non-OK status for
// local failures (files).
absl::Status Consume(const ConsumeOptions& o, client::StreamOptions stream_options,
                     uint64_t keep_bytes, std::ostream& out, std::ostream& err) {
  std::unique_ptr<SamplesOut> samples;
  if (!o.samples_out.empty()) {
    auto opened = SamplesOut::Open(o.samples_out, keep_bytes);
    if (!opened.ok()) return opened.status();
    samples = *std::move(opened);
  }
  client::Client client(o.endpoint);
  std::unique_ptr<client::Stream> stream = client.Open(stream_options);

  const auto start = Clock::now();
  auto last_progress = start;
  uint64_t sample_count = 0, batch_count = 0;
  std::set<uint64_t> epochs;
  const auto rate = [&] {
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    return s > 0 ? static_cast<double>(sample_count) / s : 0.0;
  };
  while (!o.max_batches || batch_count < *o.max_batches) {
    std::optional<client::Batch> batch = stream->Next();
    if (!batch) break;
    ++batch_count;
    sample_count += batch->size();
    epochs.insert(batch->position().epoch);
    if (samples) {
      const int64_t* labels = batch->labels().data<int64_t>();
      const int64_t* indices = batch->indices().data<int64_t>();
      std::string lines;
      for (uint32_t i = 0; i < batch->size(); ++i) {
        lines +=
            FormatSampleLine({batch->position().epoch, batch->position().sequence, indices[i],
                              labels[i], batch->relative_path(i), SampleDigest(*batch, i)});
      }
      if (absl::Status s = samples->Append(lines); !s.ok()) return s;
      if (absl::Status s = samples->Flush(); !s.ok()) return s;
    }
    if (!o.state_file.empty()) {
      // After the samples are flushed: a state never covers lines that are not in the file.
      absl::Status s = base::WriteFileAtomically(
          o.state_file,
          FormatConsumeState(stream->State(), samples ? samples->bytes() : 0, o.samples_out));
      if (!s.ok()) return s;
    }
    if (o.progress && Clock::now() - last_progress > std::chrono::milliseconds(200)) {
      last_progress = Clock::now();
      err << ProgressLine(*batch, *stream, o.epochs, batch_count, rate()) << std::flush;
    }
  }
  if (o.progress) err << "\r\033[K" << std::flush;
  out << absl::StrFormat("consumed %d samples in %d batches over %d epochs: %.1f images/s\n",
                         sample_count, batch_count, epochs.size(), rate());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<client::StreamOptions> ToStreamOptions(const ConsumeOptions& o) {
  client::StreamOptions s;
  s.dataset = o.dataset;
  s.batch_size = o.batch_size;
  s.seed = o.seed;
  s.rank = o.rank;
  s.world_size = o.world_size;
  s.image_size = o.image_size;
  if (o.augment == "train") {
    s.augment = client::Augment::kTrain;
  } else if (o.augment == "eval") {
    s.augment = client::Augment::kEval;
  } else {
    return absl::InvalidArgumentError("--augment must be train or eval, got '" + o.augment + "'");
  }
  if (o.dtype == "uint8") {
    s.dtype = client::DType::kUint8;
  } else if (o.dtype == "float32") {
    s.dtype = client::DType::kFloat32;
  } else {
    return absl::InvalidArgumentError("--dtype must be uint8 or float32, got '" + o.dtype + "'");
  }
  if (o.resize == "exact") {
    s.resize = client::Resize::kExact;
  } else if (o.resize != "fast") {
    return absl::InvalidArgumentError("--resize must be fast or exact, got '" + o.resize + "'");
  }
  s.shuffle = o.shuffle;
  s.drop_last = o.drop_last;
  if (o.epochs == 0) return absl::InvalidArgumentError("--epochs must be >= 1");
  s.end_epoch = o.epochs;
  if (!(o.reconnect_deadline_s >= 0)) {
    return absl::InvalidArgumentError("--reconnect-deadline-s must be >= 0");
  }
  s.reconnect_deadline =
      std::chrono::milliseconds(static_cast<int64_t>(o.reconnect_deadline_s * 1000));
  s.verify_checksums = o.verify;
  s.client_name = "ringloaderctl consume";
  s.restart_epoch_if_dataset_changed = o.restart_epoch_if_changed;
  return s;
}

int RunConsume(const ConsumeOptions& o, std::ostream& out, std::ostream& err) {
  const auto fail = [&](absl::string_view message, int code) {
    err << "ringloaderctl consume: " << message << "\n";
    return code;
  };
  absl::StatusOr<client::StreamOptions> stream_options = ToStreamOptions(o);
  if (!stream_options.ok()) return fail(stream_options.status().message(), kExitUsage);

  uint64_t keep_bytes = 0;
  if (!o.state_file.empty()) {
    auto text = ReadFileIfExists(o.state_file, kMaxConsumeStateBytes);
    if (!text.ok()) return fail(text.status().message(), kExitFailure);
    if (text->has_value()) {
      absl::StatusOr<ConsumeState> saved = ParseConsumeState(**text);
      if (!saved.ok()) {
        return fail(absl::StrCat("state file ", o.state_file, ": ", saved.status().message()),
                    kExitFailure);
      }
      if (absl::Status same = CheckSameRun(saved->options, *stream_options); !same.ok()) {
        return fail(absl::StrCat("state file ", o.state_file, ": ", same.message()), kExitFailure);
      }
      const uint32_t ring_slots = saved->options.ring_slots;
      client::Continuation resumed;
      try {
        resumed = client::ContinueState({saved->options, saved->world_cursors}, *stream_options);
      } catch (const client::Error& e) {
        return fail(absl::StrCat("state file ", o.state_file, ": ", e.what()), kExitFailure);
      }
      if (!resumed.warning.empty()) err << "ringloaderctl consume: warning: " << resumed.warning << "\n";
      *stream_options = std::move(resumed.options);
      stream_options->ring_slots = ring_slots;
      // Into the same samples file: keep what the saved position covers. Into another (or a
      // first) one: start it afresh with the rest of the run.
      const bool same_file = !saved->samples_out_path.empty()
                                 ? saved->samples_out_path == o.samples_out
                                 : !o.samples_out.empty();  // older states: assume the same
      keep_bytes = same_file ? saved->samples_out_bytes : 0;
    }
  }
  try {
    absl::Status s = Consume(o, *stream_options, keep_bytes, out, err);
    if (!s.ok()) return fail(s.message(), kExitFailure);
  } catch (const client::Error& e) {
    if (o.progress) err << "\r\033[K";
    return fail(e.what(),
                e.code() == client::ErrorCode::kUnavailable ? kExitUnavailable : kExitFailure);
  }
  return kExitOk;
}

}  // namespace ringloader::ctl
