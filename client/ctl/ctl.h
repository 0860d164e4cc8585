// SPDX-License-Identifier: Apache-2.0
#pragma once
// ringloaderctl's subcommands, one function each, callable from tests. Each returns the process
// exit code and writes only to the streams it is given (`out` for results, `err` for messages
// and progress). Exit codes: 0 success; 1 failure (NOT_SERVING, bad files, an RPC error);
// 2 daemon unreachable, or a usage/dataset error.

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

namespace ringloader::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUnavailable = 2;
inline constexpr int kExitUsage = 2;

// Parses argv and runs one subcommand (the whole of main()).
int Main(int argc, char** argv);

struct HealthOptions {
  std::string endpoint;
  double timeout_s = 2.0;
};
// grpc.health.v1 Check: one line, "SERVING <endpoint>" (0), "NOT_SERVING <endpoint>" (1), or
// "unreachable: <endpoint>: <gRPC error>" (2; also on timeout).
int RunHealth(const HealthOptions& options, std::ostream& out);

struct StatsOptions {
  std::string endpoint;
  bool json = false;
  // Redraw every second (clearing the terminal first when `clear`), `watch_count` times
  // (0 = until interrupted).
  bool watch = false;
  bool clear = false;
  uint64_t watch_count = 0;
};
int RunStats(const StatsOptions& options, std::ostream& out, std::ostream& err);

struct TopOptions {
  std::string endpoint;
  // Full-screen on a terminal, reading keys from stdin; else plain frames.
  bool screen = false;
  uint64_t count = 0;  // frames to draw (0 = until q or interrupted)
  std::chrono::milliseconds delay{1000};
  std::string sort;  // "input" (default), "rate", "client", "dataset" or "id"
};
int RunTop(const TopOptions& options, std::ostream& out, std::ostream& err);

struct ConsumeOptions {
  std::string endpoint;
  std::string dataset;
  uint32_t batch_size = 64;
  uint64_t epochs = 1;  // the run ends after epoch epochs-1 (a resumed run finishes the same total)
  uint64_t seed = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t image_size = 224;
  std::string augment = "train";  // train | eval
  std::string dtype = "uint8";    // uint8 | float32
  std::string resize = "fast";    // fast | exact
  bool shuffle = true;
  bool drop_last = false;
  std::optional<uint64_t> max_batches;  // stop this run after N batches
  std::string samples_out;              // empty = none
  std::string state_file;               // empty = none
  bool verify = false;
  double reconnect_deadline_s = 60;
  // Resuming a --state whose dataset changed since: start the saved epoch again (else an error).
  bool restart_epoch_if_changed = false;
  bool progress = false;  // one updating progress line on `err` (main() sets it when a TTY)
};
// Reads batches like a trainer; ends with "consumed N samples in B batches over E epochs: X
// images/s" on `out`. With state_file: resumes from it when present (its options must match),
// saves it after every batch (after flushing samples_out, via temp file + rename), and on resume
// truncates samples_out to the length recorded with the state, so a killed run never loses or
// duplicates lines. Errors: "ringloaderctl consume: <message>" on `err`.
int RunConsume(const ConsumeOptions& options, std::ostream& out, std::ostream& err);

struct MakeDatasetOptions {
  std::string out_dir;
  uint32_t count = 2000;
  uint32_t classes = 10;
  uint64_t seed = 0;
  std::string format = "imagefolder";  // imagefolder | webdataset | tfrecord | arrays
  uint32_t shard_size = 1000;          // webdataset, tfrecord: samples per shard
  uint32_t image_size = 32;            // arrays: images.npy is [N, S, S, 3]
  int64_t label_base = 0;              // tfrecord only: added to every label (1 = labels 1..K)
};
// imagefolder: out_dir/class_XX/img_NNNNNN.jpg. Other formats: that imagefolder is generated in
// out_dir/.imagefolder-tmp-<pid> (removed afterwards, also on failure) and written into out_dir
// as client/ctl/dataset_writer.h describes (webdataset with KEY.depth.npy members). Prints
// "wrote N samples in K classes to DIR as FORMAT (M shards)" ("wrote N images in K classes to
// DIR" for imagefolder). 2 for bad options or an out_dir already holding shards; 1 on failure.
int RunMakeDataset(const MakeDatasetOptions& options, std::ostream& out, std::ostream& err);

struct ConvertOptions {
  std::string from = "imagefolder";  // imagefolder only
  std::string to;                    // webdataset | tfrecord
  std::string path;                  // the source dataset's root
  std::string out_dir;               // created; must not hold shard files yet
  uint32_t shard_size = 1000;        // samples per shard
};
// Rewrites a dataset as shards (client/ctl/dataset_writer.h), reading one file at a time. Prints
// "converted N samples from SRC to DST as FORMAT (M shards)". 0 done; 1 a source file that
// cannot be read ("ringloaderctl convert: <path>: <error>") or a write error, and the shards
// written are removed again; 2 bad options, a source that cannot be opened, or an out_dir that
// already holds shards.
int RunConvert(const ConvertOptions& options, std::ostream& out, std::ostream& err);

struct ValidateOptions {
  // Either a daemon config and one of its datasets (format, path, manifest and every decode limit
  // come from there, exactly as the daemon applies them) ...
  std::string config;
  std::string dataset;
  // ... or the dataset itself, with the daemon's default limits (image::DecodeLimits).
  std::string format = "imagefolder";  // imagefolder | manifest
  std::string path;
  std::string manifest;
  std::string label;  // arrays: the NAME.npy whose rows are the labels (the config's `label`)
  uint32_t jobs = 0;  // 0 = one per CPU
  std::optional<uint64_t> max_pixels;  // unset: the config's or the default
  uint32_t io_depth = 64;  // files opened ahead of the decodes (a network mount); 0 = none
  // A sample whose read takes longer while the storage answers other reads is reported BAD
  // (deadline_exceeded) and left behind; a storage that answers nothing is waited for, said on
  // stderr (as the daemon does). Applies to reads ahead (io_depth > 0). 0 = no deadline.
  uint32_t deadline_ms = 30'000;
};
// Decodes every sample; prints "BAD <relative_path>: <reason>: <message>" per bad file in index
// order (paths escaped as proto/wire_text.h says), then "checked N files: G good, B bad"
// (+ " (reason: count, ...)"). 0 all good, 1 some bad, 2 the dataset cannot be opened.
int RunValidate(const ValidateOptions& options, std::ostream& out, std::ostream& err);

struct DoctorOptions {
  std::string config = "/etc/ringloader/ringloaderd.toml";
  // The stream shape rings are sized for (shm_dir check): uint8 images, consume's defaults.
  uint32_t batch_size = 64;
  uint32_t image_size = 224;
  // The memory cgroup the daemon runs in (a directory under /sys/fs/cgroup); empty = this
  // process's own. Its and its ancestors' limits count.
  std::string cgroup;
  // How long one dataset's indexing may take before it is reported as not answering (a mount
  // gone); the doctor then goes on to the other checks.
  double dataset_timeout_s = 30;
  // How long the running daemon has to answer (stats) before it is reported as not answering.
  double daemon_timeout_s = 5;
  // --live: only the running daemon at `endpoint`: per input-bound stream, what limits it and
  // the change to try, with the figures behind it.
  bool live = false;
  std::string endpoint;
};
// Checks the host against a daemon config before anything breaks: the config loads; shm_dir's
// free space vs the rings of max_streams streams (capped by memory_limit); the memory cgroup's
// limit (or the host's memory) vs memory_limit plus the daemon's overhead; the open-file limit vs
// max_streams; the socket's directory, group and whether the calling user may connect; state_dir
// writable; each dataset readable and indexed (no index cache is written). One line per check,
// "ok: ..." or "problem: ...; fix: ...", then a summary. 0 all ok, 1 any problem.
int RunDoctor(const DoctorOptions& options, std::ostream& out, std::ostream& err);

struct PeekOptions {
  std::string endpoint;
  // The stream, with consume's flags and meanings: dataset, batch_size, seed, rank, world_size,
  // image_size, augment, resize and shuffle (peek reads uint8 NHWC; the rest is not used).
  ConsumeOptions stream;
  uint64_t epoch = 0;
  uint64_t batch = 0;  // batch index within the epoch (for this rank)
  uint32_t columns = 8;
  std::string out;  // .png (lossless) or .jpg; the legend goes beside it as .tsv
};
// Reads batch `batch` of epoch `epoch` exactly as a trainer with those options receives it
// (uint8 NHWC: the bytes before any float32 normalisation) and writes it as a contact sheet
// (contact_sheet.h) plus a legend, `out` with the extension .tsv: a header line, then
// "tile<TAB>sample_index<TAB>label<TAB>path" per tile (paths escaped as proto/wire_text.h says).
// Prints "wrote OUT (N tiles of S px, C per row: batch B of epoch E) and LEGEND". 2 for bad
// options or a batch the epoch does not have; 1 on an RPC or write error.
int RunPeek(const PeekOptions& options, std::ostream& out, std::ostream& err);
// The legend's path for a sheet at `sheet_path` ("sheet.png" -> "sheet.tsv").
std::string LegendPath(const std::string& sheet_path);

struct QuarantineOptions {
  std::string endpoint;
  // clear only: the daemon's admin socket; empty = derived from `endpoint` (wire::AdminEndpointOf)
  std::string admin_endpoint;
  std::string dataset;  // clear only; empty = all
};
int RunQuarantineList(const QuarantineOptions& options, std::ostream& out, std::ostream& err);
int RunQuarantineClear(const QuarantineOptions& options, std::ostream& out, std::ostream& err);

}  // namespace ringloader::ctl
