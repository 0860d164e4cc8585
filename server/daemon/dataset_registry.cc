// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/dataset_registry.h"

#include <mutex>

namespace ringloader::server {

void DatasetRegistry::Add(DatasetConfig config, std::unique_ptr<pipeline::Dataset> dataset,
                          std::unique_ptr<pipeline::ReadPool> lane) {
  auto entry = std::make_unique<ServedDataset>();
  std::string name = config.name;
  entry->config = std::move(config);
  entry->dataset = std::move(dataset);
  entry->lane = std::move(lane);
  std::unique_lock lock(mu_);
  entries_.emplace(std::move(name), std::move(entry));
}

const ServedDataset* DatasetRegistry::Find(std::string_view name) const {
  std::shared_lock lock(mu_);
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.get();
}

std::vector<const ServedDataset*> DatasetRegistry::All() const {
  std::shared_lock lock(mu_);
  std::vector<const ServedDataset*> all;
  for (const auto& [name, entry] : entries_) all.push_back(entry.get());
  return all;
}

std::vector<std::string> DatasetRegistry::Names() const {
  std::shared_lock lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, entry] : entries_) names.push_back(name);
  return names;
}

void DatasetRegistry::SetIndexing(const std::string& name, bool indexing) {
  std::unique_lock lock(mu_);
  if (indexing) {
    indexing_.insert(name);
  } else {
    indexing_.erase(name);
  }
}

bool DatasetRegistry::Indexing(std::string_view name) const {
  std::shared_lock lock(mu_);
  return indexing_.find(name) != indexing_.end();
}

bool DatasetRegistry::AnyIndexing() const {
  std::shared_lock lock(mu_);
  return !indexing_.empty();
}

}  // namespace ringloader::server
