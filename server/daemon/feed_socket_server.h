// SPDX-License-Identifier: Apache-2.0
#pragma once
// The feeder's data plane (server.feeder_data_listen): service Feeder's calls over TLS sockets
// of our own (feed_socket.h), answered by the same FeederService as the gRPC port's, within the
// same limits (a quarter of memory_limit for answers, kMaxFeedsPerHost per host address).
//
// Hosts are untrusted here as on the gRPC port:
//   - mutual TLS with [tls]'s files, re-read with them on SIGHUP (new connections handshake
//     with the new set); a client certificate the daemon does not trust is told why (a kError
//     frame, UNAUTHENTICATED) and the connection closed, counted in stats' tls.clients_refused
//     as on the gRPC port (a certificate from another CA too: the handshake takes any, the
//     check comes after it); a plaintext client, a gRPC client (ALPN) or one without a
//     certificate fails the handshake, logged with its address (at most 10 lines a second) and
//     not counted, as gRPC's port does not count its failed handshakes;
//   - the client certificate is checked again before every call (a certificate that expired,
//     or a CA or allow-list a SIGHUP changed, holds for connections open since);
//   - at most kMaxFeedConnections at once, kMaxFeedConnectionsPerHost from one address (more are
//     closed at once, logged); a handshake has kFeedHandshakeTimeout, a connection idle
//     kFeedIdleTimeout is closed, and an answer its host does not take within kFeedWriteTimeout
//     is cut off with its connection;
//   - a request frame longer than kMaxRequestBytes, or not a request, ends the connection.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/daemon/feed_socket.h"
#include "server/daemon/feeder_service.h"
#include "server/daemon/tls_server.h"

namespace ringloader::server {

inline constexpr int kMaxFeedConnections = 256;
// A host holds at most a connection per call in flight and one idle per call (2 x
// kMaxFeedsPerHost); several hosts may share an address (NAT, pods on the host's network).
inline constexpr int kMaxFeedConnectionsPerHost = 8 * kMaxFeedsPerHost;
inline constexpr std::chrono::seconds kFeedHandshakeTimeout{3};
// Hosts reuse a connection idle under a minute (feeder_pool.cc): closed a little later.
inline constexpr std::chrono::seconds kFeedIdleTimeout{90};

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

 private:
  struct Connection {
    std::thread thread;
    int fd = -1;       // for Shutdown at the end; -1 once the thread closed it
    std::string host;  // its address, as ClientKeyOfPeer names it
    bool finished = false;
  };
  FeedSocketServer(int listen_fd, int wake_fd, uint16_t port, TlsServer& tls,
                   FeederService& service);
  void AcceptLoop();
  void Serve(Connection* connection);
  // A connection's calls, one after another, until it ends.
  void Converse(FeedConnection& connection);
  // The context for new handshakes: [tls]'s current files (rebuilt after a reload).
  absl::StatusOr<std::shared_ptr<SSL_CTX>> Context();
  void Warn(const std::string& what);  // at most 10 lines a second
  void ReapFinished();                 // under mu_

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: the accept loop's stop
  const uint16_t port_;
  TlsServer& tls_;
  FeederService& service_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::list<Connection> connections_;    // under mu_
  int live_ = 0;                         // under mu_: connections not finished
  std::map<std::string, int> per_host_;  // under mu_: of them, by host address
  std::shared_ptr<SSL_CTX> context_;     // under mu_
  uint64_t context_generation_ = 0;      // under mu_
  std::mutex warn_mu_;
  int64_t warn_second_ = 0;     // under warn_mu_
  int warned_this_second_ = 0;  // under warn_mu_
  std::thread acceptor_;        // last: starts once the rest is built
};

}  // namespace ringloader::server
