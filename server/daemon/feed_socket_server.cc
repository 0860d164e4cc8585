// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/feed_socket_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "server/daemon/config.h"
#include "server/daemon/stream_manager.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

FeedDeadline In(std::chrono::steady_clock::duration d) {
  return std::chrono::steady_clock::now() + d;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FeedSocketServer>> FeedSocketServer::Start(const std::string& listen,
                                                                          TlsServer& tls,
                                                                          FeederService& service) {
  std::string host, port;
  if (!SplitHostPort(listen, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", listen, "\" is not HOST:PORT"));
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot listen on ", listen, ": ", gai_strerror(rc)));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  const int zero = 0;
  // An IPv6 listen takes IPv4 hosts too (as gRPC's ports do), whatever net.ipv6.bindv6only
  // says: "[::]" is every address (config.h, ListensWhere).
  const bool bound = fd >= 0 &&
                     (found->ai_family != AF_INET6 ||
                      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) == 0) &&
                     setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
                     bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 64) == 0;
  const int bind_errno = errno;
  freeaddrinfo(found);
  if (!bound) {
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, ": ", std::strerror(bind_errno)));
  }
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const uint16_t bound_port =
      ntohs(address.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<FeedSocketServer> server(
      new FeedSocketServer(fd, wake, bound_port, tls, service));
  // The context now: [tls]'s files that do not make one fail the start, not every handshake.
  if (absl::StatusOr<std::shared_ptr<SSL_CTX>> context = server->Context(); !context.ok()) {
    return context.status();
  }
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

FeedSocketServer::FeedSocketServer(int listen_fd, int wake_fd, uint16_t port, TlsServer& tls,
                                   FeederService& service)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), tls_(tls), service_(service) {}

FeedSocketServer::~FeedSocketServer() {
  stopping_ = true;
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // An eventfd's write fails only past its counter's limit: the loop is woken already.
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Connection> connections;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Shut down, not closed: the threads close their own descriptors.
    for (Connection& c : connections_) {
      if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
    }
  }
  // The threads take mu_ to finish: joined outside it.
  for (Connection& c : connections_) c.thread.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

void FeedSocketServer::AcceptLoop() {
  pthread_setname_np(pthread_self(), "rl-feed-accept");
  pollfd waits[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (!stopping_) {
    if (poll(waits, 2, -1) < 0 && errno != EINTR) break;
    if (stopping_) break;
    if ((waits[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        Warn(absl::StrCat("cannot accept a connection: ", std::strerror(errno)));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // not a busy loop
      }
      continue;
    }
    const std::string host = ClientKeyOfPeer(FeedPeerName(fd));
    std::lock_guard<std::mutex> lock(mu_);
    ReapFinished();
    // Per host address first: a host needs at most one connection per call in flight and one
    // idle per call, and one address cannot take the port from the others.
    const int from_host = per_host_.count(host) > 0 ? per_host_[host] : 0;
    if (live_ >= kMaxFeedConnections || from_host >= kMaxFeedConnectionsPerHost) {
      // Logged before the close, so that the log says why by the time the host sees it.
      Warn(from_host >= kMaxFeedConnectionsPerHost
               ? absl::StrCat("a connection from ", host, " refused: it has ", from_host,
                              " open already")
               : absl::StrCat("a connection from ", host, " refused: ", kMaxFeedConnections,
                              " are open already"));
      ::close(fd);
      continue;
    }
    Connection& c = connections_.emplace_back();
    c.fd = fd;
    c.host = host;
    try {
      c.thread = std::thread([this, &c] { Serve(&c); });
      ++live_;
      ++per_host_[host];
    } catch (const std::system_error& e) {
      connections_.pop_back();
      ::close(fd);
      Warn(absl::StrCat("cannot start a connection's thread: ", e.what()));
    }
  }
}

void FeedSocketServer::ReapFinished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->finished) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> FeedSocketServer::Context() {
  const uint64_t current = tls_.generation();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (context_ && current == context_generation_) return context_;
  }
  // Built outside the lock (the accept loop takes it): the files a SIGHUP took.
  uint64_t generation = 0;
  const base::TlsIdentity identity = tls_.Identity(&generation);
  absl::StatusOr<std::shared_ptr<SSL_CTX>> context = MakeFeedTlsContext(identity, true);
  if (!context.ok()) return context.status();
  std::lock_guard<std::mutex> lock(mu_);
  if (!context_ || generation >= context_generation_) {  // not over a newer one built meanwhile
    context_ = *context;
    context_generation_ = generation;
  }
  return context_;
}

void FeedSocketServer::Warn(const std::string& what) {
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  bool log = false;
  {
    std::lock_guard<std::mutex> lock(warn_mu_);
    if (now != warn_second_) {
      warn_second_ = now;
      warned_this_second_ = 0;
    }
    log = warned_this_second_++ < 10;
  }
  if (log) SPDLOG_WARN("feeder data port {}: {}", port_, what);
}

void FeedSocketServer::Serve(Connection* connection) {
  pthread_setname_np(pthread_self(), "rl-feed-socket");
  const int fd = connection->fd;
  absl::StatusOr<std::shared_ptr<SSL_CTX>> context = Context();
  // The connection works on a duplicate: `fd`, which Shutdown at the end reaches, stays open
  // (and its number taken) until it is unregistered.
  const int own = context.ok() ? dup(fd) : -1;
  absl::StatusOr<std::unique_ptr<FeedConnection>> accepted =
      !context.ok() ? absl::StatusOr<std::unique_ptr<FeedConnection>>(context.status())
      : own < 0     ? absl::UnavailableError(absl::StrCat("a connection from ", connection->host,
                                                          ": dup: ", std::strerror(errno)))
                    : FeedConnection::Accept(own, context->get(), In(kFeedHandshakeTimeout));
  if (!accepted.ok()) {
    if (!stopping_) Warn(std::string(accepted.status().message()));
  } else {
    Converse(**accepted);
  }
  accepted = absl::CancelledError("");  // the connection closed (its duplicate descriptor)
  {
    std::lock_guard<std::mutex> lock(mu_);
    connection->fd = -1;
    connection->finished = true;
    --live_;
    if (--per_host_[connection->host] == 0) per_host_.erase(connection->host);
  }
  ::close(fd);
}

void FeedSocketServer::Converse(FeedConnection& c) {
  const auto refuse = [&c](const absl::Status& why) {
    v1::FeedError error;
    error.set_code(static_cast<int>(why.code()));
    error.set_message(std::string(why.message()));
    if (c.WriteFrame(kFeedFrameError, error, In(std::chrono::seconds(2))).ok()) {
      c.Close(In(std::chrono::seconds(1)));
    }
  };
  // Checked before every call, as on the gRPC port: a certificate that expires, or a CA or
  // allow-list a SIGHUP changed, holds for a connection open since (the check caches trust).
  const std::string leaf = c.PeerCertificatePem();
  const std::string chain = c.PeerChainPem();
  const auto trusted = [&] {
    absl::Status verdict = tls_.CheckClient(leaf, chain);
    if (!verdict.ok()) refuse(verdict);  // logged and counted (tls.clients_refused) by the check
    return verdict.ok();
  };
  if (!trusted()) return;  // at once: no request of its is read
  while (!stopping_) {
    absl::StatusOr<FeedConnection::Frame> frame =
        c.ReadFrame(In(kFeedIdleTimeout), kMaxRequestBytes);
    if (!frame.ok()) return;  // closed, idle too long, shut down, or a frame too long
    v1::FeedRequest request;
    if (frame->type != kFeedFrameRequest || !request.ParseFromString(frame->bytes)) {
      Warn(absl::StrCat(c.peer(), " sent a frame that is not a FeedRequest: connection ended"));
      refuse(absl::InvalidArgumentError("not a FeedRequest frame"));
      return;
    }
    if (!trusted()) return;  // again for each call: trust may have changed since the last
    absl::StatusOr<FeederService::FeedAnswer> answer =
        service_.Answer(ClientKeyOfPeer(c.peer()), request,
                        [this, &c] { return stopping_.load() || c.PeerSpoke(); });
    const FeedDeadline deadline = In(kFeedWriteTimeout);
    if (!answer.ok()) {
      v1::FeedError error;
      error.set_code(static_cast<int>(answer.status().code()));
      error.set_message(std::string(answer.status().message()));
      if (!c.WriteFrame(kFeedFrameError, error, deadline).ok()) return;
      continue;
    }
    c.Cork(true);
    absl::Status sent = c.WriteFrame(kFeedFrameHeader, answer->header, deadline);
    if (sent.ok()) sent = c.Write(answer->payload(), deadline);
    c.Cork(false);  // the answer's last bytes leave now
    if (!sent.ok()) {
      if (!stopping_) Warn(absl::StrCat(c.peer(), ": an answer cut off: ", sent.message()));
      return;
    }
    service_.Sent(*answer);
  }
}

}  // namespace ringloader::server
