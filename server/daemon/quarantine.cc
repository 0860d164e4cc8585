// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/quarantine.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <shared_mutex>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "shm/base/atomic_file.h"

namespace ringloader::server {

absl::StatusOr<std::unique_ptr<Quarantine>> Quarantine::Load(const std::string& state_dir) {
  auto q = std::unique_ptr<Quarantine>(new Quarantine(state_dir + "/quarantine.tsv"));
  std::ifstream in(q->path_);
  if (!in) return q;  // none yet
  std::unique_lock<std::shared_mutex> lock(q->mu_);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits('\t', 3));
    QuarantineEntry e;
    if (f.size() != 4 || !absl::SimpleAtoi(f[1], &e.sample_index) ||
        !absl::SimpleAtoi(f[2], &e.strikes)) {
      // Damaged (a crash mid-write on an old version, a hand edit): set it aside, start empty.
      q->entries_.clear();
      const std::string aside = q->path_ + ".damaged";
      if (std::rename(q->path_.c_str(), aside.c_str()) != 0) {
        return absl::DataLossError(
            absl::StrCat(q->path_, ":", line_no, ": damaged, and cannot be moved aside to ",
                         aside, ": ", std::strerror(errno)));
      }
      q->load_warning_ = absl::StrCat(q->path_, ":", line_no,
                                      ": expected dataset<TAB>index<TAB>strikes<TAB>path; the "
                                      "file was moved to ", aside, " and the quarantine starts "
                                      "empty");
      return q;
    }
    e.dataset = f[0];
    e.path = f[3];
    q->entries_[{e.dataset, e.sample_index}] = std::move(e);
  }
  return q;
}

absl::StatusOr<uint32_t> Quarantine::Strike(const std::string& dataset, uint64_t sample_index,
                                            const std::string& path) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  QuarantineEntry& e = entries_[{dataset, sample_index}];
  if (e.path != path) e.strikes = 0;  // a different file now sits at this index
  e.dataset = dataset;
  e.sample_index = sample_index;
  e.path = path;
  ++e.strikes;
  if (auto s = SaveLocked(); !s.ok()) return s;
  return e.strikes;
}

bool Quarantine::IsQuarantined(const std::string& dataset, uint64_t sample_index) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (entries_.empty()) return false;
  auto it = entries_.find({dataset, sample_index});
  return it != entries_.end() && it->second.strikes >= kStrikesToQuarantine;
}

uint32_t Quarantine::StrikesOf(const std::string& dataset, uint64_t sample_index) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (entries_.empty()) return 0;
  auto it = entries_.find({dataset, sample_index});
  return it == entries_.end() ? 0 : it->second.strikes;
}

absl::Status Quarantine::Absolve(const std::string& dataset, uint64_t sample_index) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = entries_.find({dataset, sample_index});
  if (it == entries_.end() || it->second.strikes >= kStrikesToQuarantine) return absl::OkStatus();
  entries_.erase(it);
  return SaveLocked();
}

std::vector<QuarantineEntry> Quarantine::Quarantined() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<QuarantineEntry> out;
  for (const auto& [key, e] : entries_) {
    if (e.strikes >= kStrikesToQuarantine) out.push_back(e);
  }
  return out;
}

absl::StatusOr<uint64_t> Quarantine::Clear(const std::string& dataset) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  uint64_t cleared = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (dataset.empty() || it->second.dataset == dataset) {
      if (it->second.strikes >= kStrikesToQuarantine) ++cleared;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  if (auto s = SaveLocked(); !s.ok()) return s;
  return cleared;
}

absl::Status Quarantine::SaveLocked() {
  std::string text;
  for (const auto& [key, e] : entries_) {
    absl::StrAppend(&text, e.dataset, "\t", e.sample_index, "\t", e.strikes, "\t", e.path, "\n");
  }
  if (absl::Status s = base::WriteFileAtomically(path_, text); !s.ok()) {
    return absl::InternalError(absl::StrCat("cannot save the quarantine: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace ringloader::server
