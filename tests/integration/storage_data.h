// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the storage tests (storage_test, storage_outage_test) share: a generated ImageFolder to
// put behind a delay mount, its [[datasets]] table, the streams they open, and each delivered
// sample as one comparable line.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "client/client.h"

namespace ringloader::testing {

// `count` synthetic JPEGs in 4 classes under `dir` (the same bytes for the same count).
void WriteDataset(const std::string& dir, uint32_t count);
// An imagefolder [[datasets]] table (max_file_bytes 64 MiB), `extra` lines appended.
std::string DatasetTable(const std::string& name, const std::string& path,
                         const std::string& extra = "");
// Batches of 8 at 32 px, seed 11, `epochs` epochs, reconnecting for up to a minute.
client::StreamOptions Options(const std::string& dataset, uint64_t epochs);
// One line per sample, in delivery order: epoch, index, label and a digest of its pixels;
// `each` runs after every batch.
std::vector<std::string> Lines(client::Stream& stream, const std::function<void()>& each = {});

}  // namespace ringloader::testing
