// SPDX-License-Identifier: Apache-2.0
#include "client/ctl/samples_out.h"

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/wire_text.h"

namespace ringloader::ctl {

uint64_t SampleDigest(std::span<const uint8_t> bytes) {
  return XXH64(bytes.data(), bytes.size(), /*seed=*/0);
}

uint64_t SampleDigest(const client::Batch& batch, uint32_t i) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, /*seed=*/0);
  for (const client::TensorView& t : batch.tensors()) {
    if (t.name() == "labels" || t.name() == "indices") continue;
    const uint64_t per_sample = t.bytes() / batch.size();
    XXH64_update(state, t.data<uint8_t>() + i * per_sample, per_sample);
  }
  const uint64_t digest = XXH64_digest(state);
  XXH64_freeState(state);
  return digest;
}

std::string FormatDigest(uint64_t digest) { return absl::StrFormat("%016x", digest); }

std::string FormatSampleLine(const SampleRecord& r) {
  const std::string path =
      r.relative_path.empty() ? std::string("-") : wire::EscapeBytes(r.relative_path);
  return absl::StrCat(r.epoch, "\t", r.sequence, "\t", r.sample_index, "\t", r.label, "\t", path,
                      "\t", FormatDigest(r.digest), "\n");
}

}  // namespace ringloader::ctl
