// SPDX-License-Identifier: Apache-2.0
#pragma once
// A daemon's /metrics, as Prometheus scrapes it: fetched by a real HTTP client (curl), and one
// series' value read from the exposition text.

#include <optional>
#include <sstream>
#include <string>

#include "tests/support/test_support.h"

namespace ringloader::testing {

// GET http://ADDRESS/metrics with curl: headers and body.
inline CommandResult Scrape(const std::string& address) {
  return RunCommand({"/usr/bin/curl", "--silent", "--show-error", "--include", "--max-time", "10",
                     "http://" + address + "/metrics"});
}

// The value of the series `key` ("name" or "name{label=\"v\",...}", labels as the daemon orders
// them) in exposition text.
inline std::optional<double> Value(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 &&
        line[key.size()] == ' ') {
      return std::stod(line.substr(key.size() + 1));
    }
  }
  return std::nullopt;
}

}  // namespace ringloader::testing
