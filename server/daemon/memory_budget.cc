#include "server/daemon/memory_budget.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringloader::server {

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->Give(bytes_);
    budget_ = other.budget_;
    bytes_ = other.bytes_;
    other.budget_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->Give(bytes_);
}

absl::StatusOr<Reservation> MemoryBudget::Reserve(uint64_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > limit_ || reserved_ > limit_ - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", FormatBytes(bytes), "; memory_limit ", FormatBytes(limit_), " has ",
        FormatBytes(limit_ - reserved_), " free (", FormatBytes(reserved_), " reserved)"));
  }
  reserved_ += bytes;
  return Reservation(this, bytes);
}

uint64_t MemoryBudget::reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

void MemoryBudget::Give(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= bytes;
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

}  // namespace ringloader::server
