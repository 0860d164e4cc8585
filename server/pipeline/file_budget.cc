// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/file_budget.h"

namespace ringloader::pipeline {

bool FileBudget::TryTake() {
  uint64_t held = held_.load();
  do {
    if (held >= limit_) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!held_.compare_exchange_weak(held, held + 1));
  uint64_t peak = peak_.load();
  while (held + 1 > peak && !peak_.compare_exchange_weak(peak, held + 1)) {
  }
  return true;
}

void FileBudget::Give() { held_.fetch_sub(1); }

}  // namespace ringloader::pipeline
