// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/dataset_registry.h"

#include <mutex>

namespace ringloader::server {

void DatasetRegistry::Add(DatasetConfig config, std::unique_ptr<pipeline::Dataset> dataset) {
  auto entry = std::make_unique<ServedDataset>();
  std::string name = config.name;
  entry->config = std::move(config);
  entry->dataset = std::move(dataset);
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

}  // namespace ringloader::server
