#pragma once
// ringloaderd's configuration: one typed struct, parsed and validated once at start-up from TOML
// (see config/ringloaderd.toml for every key with its comment), never changed afterwards.
//
// Every error names the file, the key path and the rule, e.g.
//   ringloaderd.toml: datasets[1].max_pixels: must be > 0 (got -5)
// Unknown keys are errors (a typo must not silently fall back to a default).

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/pipeline/batch_filler.h"
#include "server/pipeline/dataset.h"

namespace ringloader::server {

struct DatasetConfig {
  std::string name;
  pipeline::DatasetFormat format = pipeline::DatasetFormat::kImageFolder;
  std::string path;      // root of the images
  std::string manifest;  // manifest format only
  pipeline::OnError on_error = pipeline::OnError::kSkip;
  uint64_t max_pixels = 40'000'000;        // width*height above this is an error for the sample
  uint64_t max_file_bytes = 64ull << 20;   // larger files are an error for the sample
  bool warnings_are_errors = true;         // libjpeg warnings (truncated data) fail the sample
  uint32_t max_scans = 500;                // progressive scans allowed per image
};

enum class LogFormat { kPlain, kTimestamped };

struct FailpointConfig {
  enum class Action { kNone, kAbort, kSegfault, kOom };
  Action action = Action::kNone;
  std::string crash_on_path;     // fnmatch pattern against the sample's relative path
  uint64_t after_batches = 0;    // act after this many batches published; 0 = off
  bool enabled() const { return action != Action::kNone; }
};

struct ServerConfig {
  std::string listen = "unix:/run/ringloader/ringloader.sock";  // "unix:PATH" or "HOST:PORT"
  mode_t socket_mode = 0660;
  std::string socket_group;     // empty = the daemon's group
  std::string state_dir = "/var/lib/ringloader";
  std::string log_level = "info";
  LogFormat log_format = LogFormat::kPlain;
  uint32_t decode_threads = 0;  // 0 = all cores
  uint64_t memory_limit_bytes = 4ull << 30;
  std::string shm_dir = "/dev/shm";
  mode_t segment_mode = 0600;
  std::string segment_group;    // empty = no group access
  uint32_t ring_slots = 4;              // per stream unless the client asks
  uint32_t max_ring_slots = 32;
  uint32_t max_batch_size = 4096;
  uint32_t max_image_size = 1024;
  uint32_t max_streams = 64;            // open streams in total
  // Open streams per TCP client host (gRPC peer address without its port). Not applied to Unix
  // socket clients: gRPC 1.51 gives them all the same peer string, so for them only max_streams
  // bounds the count.
  uint32_t max_streams_per_client = 16;
  uint32_t stream_idle_timeout_ms = 30'000;  // no request for this long closes a stream
  uint32_t max_wait_ms = 2'000;         // longest NextBatch wait before answering `pending`
};

struct DaemonConfig {
  std::string source;  // file it came from, for messages
  ServerConfig server;
  std::vector<DatasetConfig> datasets;
  FailpointConfig failpoints;

  const DatasetConfig* FindDataset(std::string_view name) const;
};

// The decode limits a dataset's samples are held to.
image::DecodeLimits DecodeLimitsOf(const DatasetConfig& dataset);

// Parses and validates. InvalidArgument/NotFound with "<file>: <key path>: <rule> (got ...)".
absl::StatusOr<DaemonConfig> LoadConfig(const std::string& path);
absl::StatusOr<DaemonConfig> ParseConfig(std::string_view toml_text, const std::string& source);

// "4GiB", "512 MiB", "100M", "1000" (bytes). InvalidArgument on anything else.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);
// Parses "RINGLOADER_FAILPOINTS"-style text: "action=segv;crash_on_path=*bad*;after_batches=3".
absl::StatusOr<FailpointConfig> ParseFailpointSpec(std::string_view spec);

}  // namespace ringloader::server
