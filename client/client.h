// SPDX-License-Identifier: Apache-2.0
#pragma once
// ringloader's C++ client: connect to a ringloaderd, open a stream, read batches in place from
// the daemon's shared-memory ring.
//
//   ringloader::Client client(ringloader::client::DefaultEndpoint());
//   ringloader::StreamOptions opts;
//   opts.dataset = "imagenet-train"; opts.batch_size = 256; opts.rank = 0; opts.world_size = 8;
//   auto stream = client.Open(opts);            // throws ringloader::Error on failure
//   while (auto batch = stream->Next()) {       // std::nullopt at the end of the stream
//     const uint8_t* images = batch->images().data<uint8_t>();   // zero-copy, read-only
//     ...                                        // batch releases its slot when destroyed
//   }
//   std::string ckpt = stream->State();         // store in the trainer's checkpoint
//   auto resumed = client.Resume(ckpt);         // continues with exactly the next batch
//
// Crash isolation: if the daemon dies, Next() reconnects with backoff, reopens the stream at the
// client's own position and returns exactly the next batch; batches the trainer holds stay
// readable (their segment stays mapped until released). Only when the daemon stays unreachable past
// StreamOptions::reconnect_deadline does Next() throw (ErrorCode::kUnavailable, saying so).
//
// Holding batches: a Batch keeps its ring slot until destroyed, and any number may be kept for any
// time without stopping the stream. The daemon fills whichever slots are free; when this process
// holds all but two slots (all but one of a 2-slot ring), Next() first copies its oldest held
// batch out of the ring into private memory at the same addresses (every pointer into it stays
// valid, the bytes do not change) and gives the slot back. A copy costs one memcpy of the batch
// and the batch's size in this process's memory until it is destroyed; Stream::copies() and the
// daemon's stats count them. A trainer that lets each batch go before taking the next but one
// never copies. Copy-outs happen inside Next(): another thread writing to a held batch (with
// writable_batches) while Next() runs may lose that write.
//
// Leases: a Client holds one session with the daemon (a call kept open by a background thread for
// the Client's life, started with the first Open). When the process exits or is killed, the daemon
// sees the connection drop and closes its streams at once, so a restarted trainer finds its memory
// free again; while the session lives, the daemon never closes a stream for idleness, however
// long the trainer pauses between batches.
//
// Authority: each stream's calls carry a random token only its opener received, so no other
// process can read, release or close it; and Next() checks that every batch follows the previous
// one with no gap (kDataLoss "batch gap ..." otherwise).
//
// Datasets that change: State() records the dataset's fingerprint; resuming a state against a
// dataset whose sample list changed since (files added, removed, renamed) fails with
// kFailedPrecondition "dataset ... changed" instead of repeating or skipping samples silently
// (StreamOptions::restart_epoch_if_dataset_changed restarts that epoch instead).
//
// Deadlines: when the daemon is gone, Open() and Next() retry with backoff for
// StreamOptions::reconnect_deadline, counted from when the daemon was first found missing (a call
// that hung used up its time), and then throw kUnavailable within that deadline plus one backoff
// step (<= 250 ms), saying how long they waited.
//
// fork(): a child process inherits Clients, Streams and Batches but not their threads or their
// gRPC connection. In the child they are inert: Open() and Next() throw kFailedPrecondition
// ("... cannot be used after fork(): open a new Client in the child"), and destroying them sends
// nothing, so the parent's streams and Client keep working whatever the child does, and the child
// exits promptly. Batches the child inherited stay readable there (the mapping is copied).
//
// Elastic restarts: a state resumes in a stream of another world size, rank, batch size or
// drop_last (ContinueState): the samples the saved job had not consumed in its epoch are sharded
// over the new world, each exactly once, and later epochs shard as usual. In a lockstep job (all
// ranks took the same number of batches and none skipped a bad sample) any one rank's state is
// the job's; where ranks skipped bad samples, CombineStates of all ranks' states makes it exact.
//
// End of epoch: exactly one batch per epoch has last_in_epoch() (also with drop_last, and when
// the epoch's last files are bad), and its next() is the next epoch's first position. (A resumed
// epoch whose rest holds nothing for this rank has none: the next batch is the next epoch's.)
//
// Thread-safety: a Stream is used by one thread at a time (a second concurrent Next() throws
// kFailedPrecondition "a Stream is used by one thread at a time"); Batch objects may be destroyed
// on any thread. Client is thread-safe.
//
// The library never prints or logs; every failure is an Error (an exception carrying an
// ErrorCode and the daemon's or the library's message).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// libringloader-client.so exports what this header declares and nothing else: the library is
// built with hidden visibility, so the code compiled into it (its protobuf messages, inline code
// of the gRPC, protobuf and abseil headers) never binds to a trainer's own definitions
// (client/exports.map also fences off what those headers mark visible).
#pragma GCC visibility push(default)
namespace ringloader::client {

enum class ErrorCode {
  kUnavailable,        // daemon unreachable (past the reconnect deadline)
  kNotFound,           // unknown dataset
  kInvalidArgument,    // a bad option (the message names it)
  kResourceExhausted,  // daemon's memory_limit or a configured limit
  kDataLoss,           // on_error = "fail" and a sample failed; or a checksum mismatch
  kFailedPrecondition,
  kInternal,
  kDeadlineExceeded,  // Stream::Next(timeout): no batch in time (the stream goes on)
  kCancelled,         // Client::Open(options, interrupted): the caller's `interrupted` said so
};
const char* ErrorCodeName(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Element types (numpy's names). Images are kUint8 or kFloat32, labels and indices kInt64; a
// dataset's extra tensors may be any of them.
enum class DType {
  kUint8, kFloat32, kInt64, kInt8, kInt16, kUint16, kInt32, kUint32, kUint64, kFloat16,
  kFloat64, kBool
};
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

// A read-only view of one tensor inside a mapped ring slot.
class TensorView {
 public:
  TensorView() = default;
  TensorView(const void* data, std::vector<int64_t> shape, DType dtype, uint64_t bytes,
             std::string name = "")
      : data_(data), shape_(std::move(shape)), dtype_(dtype), bytes_(bytes),
        name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  const void* raw() const { return data_; }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }
  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  uint64_t bytes() const { return bytes_; }

 private:
  const void* data_ = nullptr;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::kUint8;
  uint64_t bytes_ = 0;
  std::string name_;
};

// Where a stream is. Resuming at `next` of a batch yields the batch after it.
struct Position {
  uint64_t epoch = 0;
  uint64_t sequence = 0;  // batch index within the epoch for this rank
  uint64_t cursor = 0;    // shard position where that batch starts
  bool operator==(const Position&) const = default;
};

// How far a job got through an epoch, as positions of that epoch's global order (the order
// before it is sharded over ranks): [0, prefix) and `beyond` are consumed. Empty: none.
struct EpochProgress {
  uint64_t prefix = 0;
  std::vector<uint64_t> beyond;  // ascending, each > prefix
  bool empty() const { return prefix == 0 && beyond.empty(); }
  bool operator==(const EpochProgress&) const = default;
};

// The world a state was saved in, when a stream continues it with another world size, rank,
// batch size or drop_last (set by ContinueState; see "Elastic restarts" above).
struct SavedWorld {
  uint32_t world_size = 0;  // 0: none
  bool drop_last = false;
  // Per rank of that world: how far along its shard it got; kWholeShard: all of it.
  std::vector<uint64_t> cursors;
  static constexpr uint64_t kWholeShard = ~uint64_t{0};
};

enum class Augment { kTrain, kEval };
// kFast: libjpeg's DCT scaling where it still covers the output (the default; see
// image::TransformSpec::exact_resize for the measured difference). kExact: full-size decode,
// resampled like PIL: within 0.01 levels of torchvision's Resize, for reproducing published
// accuracy.
enum class Resize { kFast, kExact };
enum class Layout { kNHWC, kNCHW };

struct StreamOptions {
  std::string dataset;
  uint32_t batch_size = 64;
  uint64_t seed = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t image_size = 224;
  Augment augment = Augment::kTrain;
  DType dtype = DType::kUint8;  // kUint8 or kFloat32 (normalised with mean/std)
  Layout layout = Layout::kNHWC;
  Resize resize = Resize::kFast;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t end_epoch = 0;        // the stream ends after epoch end_epoch-1; 0 = never
  // float32 only; empty = ImageNet's. Each value in [-1e6, 1e6], std values >= 1e-6.
  std::vector<float> mean, std;
  uint32_t ring_slots = 0;       // 0 = the daemon's default
  Position start;                // where to begin
  std::string client_name;       // shown in the daemon's stats
  // How long Next() keeps reconnecting to a dead daemon before throwing kUnavailable.
  std::chrono::milliseconds reconnect_deadline = std::chrono::seconds(60);
  // Verify each batch's checksum against the slot descriptor (costs one pass over the bytes).
  bool verify_checksums = false;
  // Batches are writable: each slot is mapped copy-on-write, so a write lands in pages private
  // to this process (never in the ring, never seen by other readers) and is dropped when the
  // batch is released; the slot's next batch reads the daemon's bytes again. Costs page faults
  // on every batch's first reads and writes (bench/ring_bench prints how much); off: batches are
  // read-only and a write faults (SIGSEGV), with no per-batch cost.
  bool writable_batches = false;
  // The dataset's fingerprint (Stream::dataset_fingerprint()) when the position in `start` was
  // saved; 0 = do not check. Kept in State(). If the daemon's dataset now differs (files added,
  // removed or renamed), Open() fails with kFailedPrecondition "dataset ... changed": resuming
  // the old position would repeat or skip samples. Once open, a stream also refuses to reopen
  // after a daemon restart against a changed dataset.
  uint64_t dataset_fingerprint = 0;
  // With a fingerprint that no longer matches: start the saved epoch again from its first batch
  // (with the new sample list) instead of failing.
  bool restart_epoch_if_dataset_changed = false;
  // Resuming inside an epoch another world began (ContinueState sets these): the progress epoch
  // start.epoch continues after (start.cursor counts within this rank's share of the rest), and
  // the world that saved it, whose consumption the daemon adds to it. Empty: the whole epoch.
  EpochProgress start_progress;
  SavedWorld saved_world;
};

class Stream;

// One batch, in place in the read-only mapped ring (or copied out of it: see "Holding batches").
// Releases its slot when destroyed.
// Move-only. Stays readable even if the daemon dies, until destroyed. A moved-from Batch reads
// as an empty one (size 0, empty views, sample_image() null).
class Batch {
 public:
  ~Batch();
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;

  const TensorView& images() const;   // [n, H, W, 3] uint8 or [n, 3, H, W] float32 ...
  const TensorView& labels() const;   // int64 [n] (-1 where the dataset has no labels)
  const TensorView& indices() const;  // int64 [n]: dataset sample indices
  // Every tensor of the batch, in payload order: "images" (not for an arrays dataset),
  // "labels", "indices", then the dataset's extra tensors ("depth" of a WebDataset's
  // KEY.depth.npy members, every NAME.npy of an arrays dataset) and NAME_lengths for ragged
  // ones. Each starts 256-byte aligned; shape [n, ...one sample's shape].
  const std::vector<TensorView>& tensors() const;
  // The tensor called `name`; throws Error(kNotFound) naming the tensors the batch has.
  const TensorView& tensor(std::string_view name) const;
  uint32_t size() const;              // n
  const Position& position() const;   // this batch
  const Position& next() const;       // resume here for the batch after this one
  bool last_in_epoch() const;
  uint64_t incarnation() const;  // of the daemon that produced it
  // Bytes of sample i's image (i < size()).
  const uint8_t* sample_image(uint32_t i) const;
  uint64_t sample_image_bytes() const;
  // Dataset-relative path of sample i (i < size()); empty if the daemon did not send paths.
  std::string_view relative_path(uint32_t i) const;
  // Moves the batch out of the ring now: into private memory at the same addresses (every
  // pointer into it stays valid, the bytes do not change), its slot given back with the next
  // Next(). For a batch kept long; Next() does it by itself when held batches would leave the
  // daemon no slot (see "Holding batches"). Does nothing when it is already out or moved from.
  // Throws kResourceExhausted when the copy cannot be allocated.
  void Detach();

  struct Impl;
  explicit Batch(std::unique_ptr<Impl> impl);

 private:
  const Impl& impl() const;  // an empty batch's when moved from: accessors never crash
  std::unique_ptr<Impl> impl_;
};

class Stream {
 public:
  ~Stream();  // closes the stream on the daemon (best effort)
  // The next batch, or std::nullopt after end_epoch. Throws Error (see the top of this file).
  std::optional<Batch> Next();
  // The same, waiting at most `timeout` for the batch: then throws kDeadlineExceeded and the
  // stream stays usable (the next call returns that batch). Also while reconnecting to a dead
  // daemon: the call gives up after `timeout` (plus at most a brief wait for the session) and
  // the next call goes on reconnecting; an open already sent is not sent again but waited for
  // (a daemon making a ring of gigabytes takes a second or more to answer, whatever slices the
  // caller waits in); kUnavailable still comes once the daemon has been gone for
  // reconnect_deadline, counted from when it went missing, however the waits were sliced.
  std::optional<Batch> Next(std::chrono::milliseconds timeout);
  // Position of the next batch Next() will return.
  Position position() const;
  // A small serialised position (with the options it belongs to) for the trainer's checkpoint.
  std::string State() const;
  const StreamOptions& options() const;
  // Daemon reconnects this stream has survived.
  uint64_t reconnects() const;
  // Held batches copied out of the ring so far, by Next() (see "Holding batches" at the top of
  // this file) or by Batch::Detach().
  uint64_t copies() const;
  // Is the trainer input-bound? This stream measures the trainer's time since it opened (across
  // reconnects): waiting inside Next() for batches (and for a restarting daemon), and between
  // Next() calls (its step, and copying held batches out of the ring), and reports both with its
  // requests. input_bound() is the daemon's judgement with its latest answer: the share of the
  // last minute the trainer spent waiting, wait / (wait + step), 0..1; under 0.05 it is not
  // input-bound, over 0.2 highly. -1 before the daemon has said (or one too old to say). Any
  // thread may call these.
  std::chrono::nanoseconds trainer_wait() const;
  std::chrono::nanoseconds trainer_step() const;
  double input_bound() const;
  // The fingerprint of the dataset this stream reads (see StreamOptions::dataset_fingerprint).
  uint64_t dataset_fingerprint() const;
  // The progress the stream's first epoch (options().start.epoch) continues after, with a saved
  // world's consumption applied once the daemon has answered (see "Elastic restarts"). Empty
  // when the stream reads that epoch whole.
  EpochProgress start_progress() const;
  // Samples in the dataset, in one epoch of this rank's shard, and batches in one such epoch
  // (exact unless samples are skipped; then an upper bound), as the daemon said at open.
  uint64_t dataset_size() const;
  uint64_t samples_per_epoch() const;
  uint64_t batches_per_epoch() const;

  struct Impl;
  explicit Stream(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

class Client {
 public:
  // endpoint: "unix:/path/to.sock", "unix:///abs/path" or "host:port".
  explicit Client(std::string endpoint);
  ~Client();
  // Opens a stream at options.start (retrying a dead daemon until options.reconnect_deadline).
  // Throws Error: kInvalidArgument (ValidateOptions or the daemon), kNotFound (unknown dataset),
  // kResourceExhausted, kUnavailable (daemon unreachable past the deadline), ...
  std::unique_ptr<Stream> Open(const StreamOptions& options);
  // The same, polling `interrupted` at least every 200 ms while it waits for the daemon (for a
  // connection, between attempts, or for an open's answer): once it returns true, Open stops and
  // throws kCancelled; an open in flight is cancelled and the daemon drops what it made for it.
  // For callers that must stay responsive while a daemon is absent (the Python package checks
  // for Ctrl-C in it). `interrupted` runs on the calling thread and only during this call.
  std::unique_ptr<Stream> Open(const StreamOptions& options,
                               const std::function<bool()>& interrupted);
  // Opens a stream from Stream::State(), continuing with exactly the batch after the one the
  // state was taken after (a job's state, CombineStates, is refused: it names no rank). Options not kept in the state
  // (reconnect_deadline, verify_checksums, client_name) take their defaults; to change them, or
  // to continue at another world size, rank or batch size, use ContinueState() and Open().
  std::unique_ptr<Stream> Resume(const std::string& state);
  const std::string& endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// $RINGLOADER_ENDPOINT (when set and non-empty), else "unix:/run/ringloader/ringloader.sock".
std::string DefaultEndpoint();

// The daemon's standard health status (grpc.health.v1) at `endpoint`: "SERVING" once it serves,
// "NOT_SERVING" while it starts or stops. Throws Error: kUnavailable, with why (no socket, no
// permission, ...), when nothing answers within `timeout`.
std::string HealthStatus(const std::string& endpoint, std::chrono::milliseconds timeout);

// The version of the installed SDK (libringloader-client.so), e.g. "0.1.0". Only in the shared
// library (find_package(ringloader) / pkg-config ringloader-client).
const char* Version();

// Checks options before anything is sent; throws Error(kInvalidArgument) naming the option and
// the rule, e.g. "StreamOptions.rank: must be < world_size (got rank 4, world_size 4)".
// world_size and saved_world.world_size are at most 65,536, start_progress.beyond holds at most
// 65,536 positions (the daemon refuses more; proto/resume_limits.h says why).
// Open() calls it; the daemon applies its own limits (max batch size, ...) on top.
void ValidateOptions(const StreamOptions& options);

// The state text is one line:
//   ringloader-state v3 dataset=<percent-encoded> batch_size=64 seed=0 rank=0 world_size=1
//   image_size=224 augment=train|eval dtype=uint8|float32 layout=nhwc|nchw shuffle=1 drop_last=0
//   end_epoch=2 ring_slots=0 epoch=1 sequence=7 cursor=448 [mean=a,b,c std=a,b,c]
//   [resize=exact] [fingerprint=<16 hex digits>] [progress=<prefix> [beyond=p,q,...]]
//   [cursors=c0,c1,...] check=<16 hex digits> end
// The check is XXH3-64 of the text before " check="; " end" terminates the line. A state cut
// short anywhere, altered, or holding a value out of range (epoch >= 2^32, std < 1e-6, ...) is
// refused naming the problem, and so is one past the limits a forged state could otherwise
// make the reader allocate for: a text over 4 MiB, world_size over 65,536 (one cursor per
// rank), more than 65,536 beyond positions. States of format v2 (no progress or cursors) and
// v1 (no check either) are still read.
// Fields may appear in any order; every field up to cursor is required; unknown or repeated
// fields are errors. The position fields are where the stream resumes; progress and beyond are
// the epoch's start_progress; cursors (a job's state, CombineStates: every rank's cursor, "end"
// for a rank that finished the epoch) replace the one rank's position.
struct ResumeState {
  StreamOptions options;  // options.start = the position to resume at
  // A job's state (CombineStates): each rank of options.world_size's cursor in epoch
  // options.start.epoch (SavedWorld::kWholeShard: finished). Empty: one rank's state.
  std::vector<uint64_t> world_cursors;
};
// Parses Stream::State() text (leading/trailing whitespace ignored). Throws
// Error(kInvalidArgument) whose message names the bad field, e.g.
// "invalid ringloader state: field 'batch_size': not an unsigned integer: 'x'".
ResumeState ParseState(const std::string& state);
// Formats `options` (the fields listed above; options.start_progress as the progress of
// next.epoch) with position `next`, and `world_cursors` for a job's state.
std::string FormatState(const StreamOptions& options, const Position& next,
                        const std::vector<uint64_t>& world_cursors = {});

// Continuing a state in a stream with `options`: its world size, rank, batch size, drop_last,
// end_epoch and the options no state keeps (client_name, reconnect_deadline, ...).
struct Continuation {
  StreamOptions options;  // for Client::Open: the state's position, fingerprint and progress
  // Set when the resume may not be exact: one rank's state from a job whose ranks skipped bad
  // samples (how many samples may be read twice, and what to do instead). Empty otherwise.
  std::string warning;
};
// With the state's own world size, rank, batch size and drop_last (and one rank's state), the
// stream continues exactly as the saved one would have. Otherwise the rest of the saved epoch is
// sharded over the new world (see "Elastic restarts"). Throws Error(kInvalidArgument) naming
// the first option that differs where no resume can be exact: dataset, seed, shuffle,
// image_size, augment, dtype, layout, resize, mean, std; e.g. "the state was saved with seed=1,
// these options have seed=2 ...".
Continuation ContinueState(const ResumeState& state, const StreamOptions& options);

// One state for a whole job from the states of all ranks of its world, in any order: where
// each rank got to, so a resume is exact even where ranks skipped different bad samples.
// Throws Error(kInvalidArgument) naming what contradicts: options that differ, a rank missing
// or given twice, ranks in different epochs (except a rank at the very start of the next one),
// a state that is already a job's.
std::string CombineStates(const std::vector<std::string>& states);

}  // namespace ringloader::client
#pragma GCC visibility pop

namespace ringloader {
using client::Batch;
using client::Client;
using client::Error;
using client::ErrorCode;
using client::Stream;
using client::StreamOptions;
}  // namespace ringloader
