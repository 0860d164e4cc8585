// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: ringloaderd.toml parsing and validation (server/daemon/config.h).
//
// Input: the text of a config file. Seed files in corpus/config are valid configs that set every
// key and broken ones; config.dict lists the keys and values worth splicing in.
//
// Besides "no crash, no uncaught exception, no undefined behaviour", each input checks:
//   - an error is InvalidArgument and names the file ("fuzz.toml...");
//   - an accepted config holds what validation promises (at least one dataset, unique names,
//     absolute paths, bounds that config.cc enforces);
//   - short inputs also go through ParseByteSize and ParseFailpointSpec (the environment variable
//     RINGLOADER_FAILPOINTS) without crashing.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "server/daemon/config.h"

namespace {

constexpr char kSource[] = "fuzz.toml";

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "config_fuzzer: contract violated: %s (status: %s)\n", what,
               status.ToString().c_str());
  std::abort();
}

void CheckAccepted(const ringloader::server::DaemonConfig& config) {
  const absl::Status ok;
  if (config.source != kSource) Fail("source not recorded", ok);
  std::set<std::string> names;
  for (const auto& d : config.datasets) {
    if (d.name.empty() || !names.insert(d.name).second) Fail("empty or duplicate dataset name", ok);
    if (d.path.empty() || d.path[0] != '/') Fail("dataset path is not absolute", ok);
    if (d.max_pixels == 0 || d.max_scans == 0) Fail("dataset limit of 0 accepted", ok);
    if (d.format == ringloader::pipeline::DatasetFormat::kManifest && d.manifest.empty()) {
      Fail("manifest dataset without a manifest", ok);
    }
  }
  const auto& s = config.server;
  if (s.listen.empty() || s.state_dir.empty()) Fail("empty listen or state_dir accepted", ok);
  // 0 = the default rule (4, or 3 for batches over 8 MiB); 1 slot cannot work.
  if (s.ring_slots == 1 || s.ring_slots > s.max_ring_slots) Fail("ring_slots out of range", ok);
  if (s.max_batch_size == 0 || s.max_image_size == 0 || s.max_streams == 0) {
    Fail("a server bound of 0 accepted", ok);
  }
  if ((s.socket_mode & ~0777u) != 0 || (s.segment_mode & ~0777u) != 0) Fail("bad mode", ok);
  if (s.memory_limit_bytes < (16ull << 20)) Fail("memory_limit below 16MiB accepted", ok);
  if (config.failpoints.enabled() && config.failpoints.crash_on_path.empty() &&
      config.failpoints.after_batches == 0) {
    Fail("failpoint without a trigger accepted", ok);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  auto config = ringloader::server::ParseConfig(text, kSource);
  if (config.ok()) {
    CheckAccepted(*config);
  } else {
    const absl::Status& s = config.status();
    if (s.code() != absl::StatusCode::kInvalidArgument) Fail("error is not InvalidArgument", s);
    if (s.message().substr(0, sizeof(kSource) - 1) != kSource) Fail("error does not name file", s);
  }

  if (size <= 256) {
    auto bytes = ringloader::server::ParseByteSize(text);
    if (!bytes.ok() && bytes.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("ParseByteSize error is not InvalidArgument", bytes.status());
    }
    auto failpoints = ringloader::server::ParseFailpointSpec(text);
    if (!failpoints.ok() && failpoints.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("ParseFailpointSpec error is not InvalidArgument", failpoints.status());
    }
  }
  return 0;
}
