// SPDX-License-Identifier: Apache-2.0
#pragma once
// The datasets a daemon serves, each with its config entry. Datasets are only ever added (at
// start-up, and by a SIGHUP reload that finds new [[datasets]] entries), never removed or
// replaced, so a pointer from Find() stays valid for the registry's life.
//
// Thread-safety: thread-safe (readers share a lock; Add takes it exclusively).

#include <map>
#include <set>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "server/daemon/config.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/read_pool.h"

namespace ringloader::server {

struct ServedDataset {
  DatasetConfig config;
  std::unique_ptr<pipeline::Dataset> dataset;
  // Its read lane (server.io_depth threads of its own: a mount that stops answering holds only
  // this dataset's reads); null with io_depth = 0.
  std::unique_ptr<pipeline::ReadPool> lane;
};

class DatasetRegistry {
 public:
  // REQUIRES: no dataset named config.name yet.
  void Add(DatasetConfig config, std::unique_ptr<pipeline::Dataset> dataset,
           std::unique_ptr<pipeline::ReadPool> lane = nullptr);
  // nullptr for an unknown name.
  const ServedDataset* Find(std::string_view name) const;
  // Every dataset, in name order.
  std::vector<const ServedDataset*> All() const;
  std::vector<std::string> Names() const;
  // Datasets being indexed (at start-up, after the daemon started serving without them: their
  // storage is slow or does not answer). Find() has them once indexed.
  void SetIndexing(const std::string& name, bool indexing);
  bool Indexing(std::string_view name) const;
  bool AnyIndexing() const;

 private:
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  mutable std::shared_mutex mu_;
  std::map<std::string, std::unique_ptr<ServedDataset>, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
  std::set<std::string, std::less<>> indexing_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringloader::server
