// SPDX-License-Identifier: Apache-2.0
#pragma once
// The feeder's data plane (server.feeder_data_listen): service Feeder's calls over TLS sockets
// of our own (feed_socket.h), answered by the same FeederService as the gRPC port's, within the
// same limits (a quarter of memory_limit for answers, kMaxFeedsPerHost per host address).
//
// Hosts are untrusted here as on the gRPC port:
//   - mutual TLS with [tls]'s files, re-read with them on SIGHUP (new connections handshake
//     with the new set); a client certificate the daemon does not trust is told why (a kError
//     frame, UNAUTHENTICATED) and the connection closed; a plaintext client, a gRPC client
//     (ALPN) or one without a certificate fails the handshake, logged with its address;
//   - at most kMaxFeedConnections at once (more are closed at once, logged); a handshake has
//     kFeedHandshakeTimeout, a connection idle kFeedIdleTimeout is closed, and an answer its host
//     does not take within kFeedWriteTimeout is cut off with its connection;
//   - a frame longer than kMaxFrameBytes, or not a request, ends the connection.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/daemon/feed_socket.h"
#include "server/daemon/feeder_service.h"
#include "server/daemon/tls_server.h"

namespace ringloader::server {

inline constexpr int kMaxFeedConnections = 64;
inline constexpr std::chrono::seconds kFeedHandshakeTimeout{10};
inline constexpr std::chrono::seconds kFeedIdleTimeout{300};

class FeedSocketServer {
 public:
  // Listens on `listen` ("HOST:PORT"). `tls` and `service` outlive the server. Errors name the
  // address and why.
  static absl::StatusOr<std::unique_ptr<FeedSocketServer>> Start(const std::string& listen,
                                                                 TlsServer& tls,
                                                                 FeederService& service);
  // Stops listening, ends every connection (a fill in progress stops) and waits for them.
  ~FeedSocketServer();

  uint16_t port() const { return port_; }
  uint64_t refused() const { return refused_.load(); }  // handshakes failed, clients refused

 private:
  struct Connection {
    std::thread thread;
    int fd = -1;  // for Shutdown at the end; -1 once the thread closed it
    bool finished = false;
  };
  FeedSocketServer(int listen_fd, uint16_t port, TlsServer& tls, FeederService& service);
  void AcceptLoop();
  void Serve(Connection* connection);
  // The context for new handshakes: [tls]'s current files (rebuilt after a reload).
  absl::StatusOr<std::shared_ptr<SSL_CTX>> Context();
  void Warn(const std::string& what);  // at most 10 lines a second
  void ReapFinished();                 // under mu_

  const int listen_fd_;
  const uint16_t port_;
  TlsServer& tls_;
  FeederService& service_;
  int wake_fd_ = -1;  // an eventfd: the accept loop's stop
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> refused_{0};
  std::mutex mu_;
  std::list<Connection> connections_;  // under mu_
  int live_ = 0;                       // under mu_: connections not finished
  std::shared_ptr<SSL_CTX> context_;   // under mu_
  uint64_t context_generation_ = 0;    // under mu_
  std::mutex warn_mu_;
  int64_t warn_second_ = 0;     // under warn_mu_
  int warned_this_second_ = 0;  // under warn_mu_
  std::thread acceptor_;        // last: starts once the rest is built
};

}  // namespace ringloader::server
