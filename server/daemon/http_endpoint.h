// SPDX-License-Identifier: Apache-2.0
#pragma once
// A small HTTP/1.1 server for monitoring: GET (or HEAD) of one of its paths answers with the
// text that path's callback builds; anything else is 404 or 405. Built on libmicrohttpd with one epoll thread
// for every connection, so idle, slow or trickling clients hold a connection slot each, never
// a thread: a scrape is answered however many of them there are (up to kMaxConnections; an idle
// one is closed after kIdleTimeoutSeconds without a byte).
//
// Thread-safety: `respond` runs on the server's thread, one request at a time.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

struct MHD_Daemon;

namespace ringloader::server {

class HttpEndpoint {
 public:
  static constexpr unsigned kMaxConnections = 1024;  // the most Start() allows
  static constexpr unsigned kIdleTimeoutSeconds = 10;

  struct Page {
    std::string path;          // e.g. "/metrics"
    std::string content_type;  // e.g. "text/plain; version=0.0.4; charset=utf-8"
    std::function<std::string()> respond;
  };

  // Listens on `listen` ("HOST:PORT", "[V6]:PORT"), serving `pages`, with up to
  // `max_connections` connections at once (each an open file; at most kMaxConnections).
  // Unavailable naming the address and why when it cannot (address in use, unknown host).
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& listen, std::vector<Page> pages,
      unsigned max_connections = kMaxConnections);
  ~HttpEndpoint();  // stops the thread and closes every connection; no response runs past it
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // The port it listens on (the kernel's pick for port 0).
  int port() const { return port_; }

 private:
  explicit HttpEndpoint(std::vector<Page> pages) : pages_(std::move(pages)) {}
  const std::vector<Page> pages_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace ringloader::server
