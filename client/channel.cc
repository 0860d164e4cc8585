// SPDX-License-Identifier: Apache-2.0
#include "client/channel.h"

#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace ringloader::client {
namespace {

absl::Status BadEndpoint(absl::string_view endpoint, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("invalid endpoint '", endpoint, "': ", why,
                                                 " (expected unix:/path, unix:///path or "
                                                 "host:port)"));
}

}  // namespace

absl::StatusOr<std::string> GrpcTarget(absl::string_view endpoint) {
  if (endpoint.empty()) return BadEndpoint(endpoint, "empty");
  if (endpoint.front() == '/') return absl::StrCat("unix:", endpoint);
  if (absl::StartsWith(endpoint, "unix:")) {
    absl::string_view rest = endpoint.substr(5);
    if (absl::StartsWith(rest, "//")) {
      rest.remove_prefix(2);  // "unix://" + authority + path; the authority must be empty
      if (!absl::StartsWith(rest, "/")) return BadEndpoint(endpoint, "unix:// takes no host");
    }
    if (rest.empty()) return BadEndpoint(endpoint, "empty socket path");
    return absl::StrCat("unix:", rest);
  }
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos) return BadEndpoint(endpoint, "no port");
  absl::string_view host = endpoint.substr(0, colon);
  absl::string_view port = endpoint.substr(colon + 1);
  if (host.empty()) return BadEndpoint(endpoint, "empty host");
  if (host.front() == '[' && host.back() != ']') return BadEndpoint(endpoint, "unclosed '['");
  if (host.front() != '[' && absl::StrContains(host, ':')) {
    return BadEndpoint(endpoint, "IPv6 addresses must be written [addr]:port");
  }
  uint32_t port_number = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &port_number) || port_number == 0 || port_number > 65535) {
    return BadEndpoint(endpoint, "port must be a number in 1..65535");
  }
  return std::string(endpoint);
}

namespace {

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

absl::StatusOr<std::optional<base::TlsPaths>> TlsPathsFromEnvironment() {
  base::TlsPaths paths;
  paths.ca_key = "RINGLOADER_TLS_CA";
  paths.cert_key = "RINGLOADER_TLS_CERT";
  paths.key_key = "RINGLOADER_TLS_KEY";
  paths.ca = Env("RINGLOADER_TLS_CA");
  paths.cert = Env("RINGLOADER_TLS_CERT");
  paths.key = Env("RINGLOADER_TLS_KEY");
  // The daemon checks the chain and the dates, and says what it finds on both sides.
  paths.check_chain = false;
  std::vector<std::string> missing;
  for (const auto& [name, value] : {std::pair<const char*, const std::string&>{
                                        "RINGLOADER_TLS_CA", paths.ca},
                                    {"RINGLOADER_TLS_CERT", paths.cert},
                                    {"RINGLOADER_TLS_KEY", paths.key}}) {
    if (value.empty()) missing.push_back(name);
  }
  if (missing.size() == 3) return std::nullopt;
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RINGLOADER_TLS_CA, RINGLOADER_TLS_CERT and RINGLOADER_TLS_KEY go together (mutual TLS): ",
        absl::StrJoin(missing, " and "), missing.size() == 1 ? " is" : " are", " not set"));
  }
  return paths;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 10);
  // Despite its name this is gRPC's minimum *connect timeout* (handshake included); the retry
  // delays are the initial/max backoff around it.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Batch handles are small; stats with many bad files can be larger than the 4 MiB default.
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!absl::StartsWith(target, "unix:")) {
    absl::StatusOr<std::optional<base::TlsPaths>> paths = TlsPathsFromEnvironment();
    if (!paths.ok()) return paths.status();
    if (paths->has_value()) {
      absl::StatusOr<base::TlsIdentity> identity = base::LoadTlsIdentity(**paths, NowSeconds());
      if (!identity.ok()) return identity.status();
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = identity->ca_pem;
      ssl.pem_private_key = identity->key_pem;
      ssl.pem_cert_chain = identity->cert_pem;
      credentials = grpc::SslCredentials(ssl);
      if (const std::string name = Env("RINGLOADER_TLS_SERVER_NAME"); !name.empty()) {
        args.SetSslTargetNameOverride(name);
      }
    }
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

namespace {

// The Unix socket path of `endpoint`, or "" for other endpoints.
std::string UnixSocketPath(const std::string& endpoint) {
  absl::StatusOr<std::string> target = GrpcTarget(endpoint);
  if (!target.ok() || !absl::StartsWith(*target, "unix:")) return "";
  return target->substr(5);
}

// One connect() to the Unix socket at `path`, closed at once (after `on_connected`, if given,
// saw the connected socket): 0 when it was accepted, else errno. Non-blocking: a listener whose
// backlog is full (a frozen daemon) gives EAGAIN, never a wait.
int ConnectUnix(const std::string& path, const std::function<void(int fd)>& on_connected = {}) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return ENAMETOOLONG;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno;
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  if (err == 0 && on_connected) on_connected(fd);
  ::close(fd);
  return err;
}

// What one TLS handshake of ours finds at a TCP endpoint (no certificate of ours, nothing
// verified): whether anything accepts, whether it speaks TLS, and the certificates it shows.
struct TlsProbe {
  int connect_error = 0;  // errno of the TCP connect; 0 = connected
  bool speaks_tls = false;
  std::string leaf_pem, chain_pem;
};

std::string PemOf(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(size));
  BIO_free(bio);
  return pem;
}

// A TCP connection to host:port within `timeout`: the socket, or -errno.
int ConnectTcp(const std::string& host, const std::string& port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return -EHOSTUNREACH;
  }
  int result = -ECONNREFUSED;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      socklen_t len = sizeof(err);
      err = ::poll(&p, 1, timeout_ms) == 1 &&
                    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0
                ? err
                : ETIMEDOUT;
    }
    if (err == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    ::close(fd);
    result = -err;
  }
  ::freeaddrinfo(found);
  return result;
}

TlsProbe ProbeTls(const std::string& host, const std::string& port) {
  TlsProbe probe;
  const int fd = ConnectTcp(host, port, 2000);
  if (fd < 0) {
    probe.connect_error = -fd;
    return probe;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  timeval two_seconds{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &two_seconds, sizeof(two_seconds));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &two_seconds, sizeof(two_seconds));
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = ctx != nullptr ? SSL_new(ctx) : nullptr;
  if (ssl != nullptr) {
    SSL_set_verify(ssl, SSL_VERIFY_NONE, nullptr);
    SSL_set_fd(ssl, fd);
    SSL_connect(ssl);  // fails at the end when the daemon wants our certificate: that is fine
    if (X509* leaf = SSL_get1_peer_certificate(ssl); leaf != nullptr) {
      probe.speaks_tls = true;
      probe.leaf_pem = PemOf(leaf);
      X509_free(leaf);
      if (STACK_OF(X509)* chain = SSL_get_peer_cert_chain(ssl); chain != nullptr) {
        for (int i = 0; i < sk_X509_num(chain); ++i) probe.chain_pem += PemOf(sk_X509_value(chain, i));
      }
    }
    SSL_free(ssl);
  }
  SSL_CTX_free(ctx);
  ERR_clear_error();
  ::close(fd);
  return probe;
}

std::string DiagnoseTcp(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return "no connection (is ringloaderd running and the endpoint right?)";
  std::string host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const TlsProbe probe = ProbeTls(host, endpoint.substr(colon + 1));
  if (probe.connect_error != 0) {
    return absl::StrCat("no connection to ", endpoint, ": ", std::strerror(probe.connect_error),
                        " (is ringloaderd running, and the endpoint right?)");
  }
  absl::StatusOr<std::optional<base::TlsPaths>> paths = TlsPathsFromEnvironment();
  if (!paths.ok()) return std::string(paths.status().message());
  const bool have_tls = paths->has_value();
  if (probe.speaks_tls && !have_tls) {
    absl::StatusOr<base::CertificateFacts> facts = base::DescribeCertificate(probe.leaf_pem);
    return absl::StrCat(
        "the daemon at ", endpoint, " speaks TLS",
        facts.ok() ? absl::StrCat(" (its certificate ", facts->subject, ", issuer ", facts->issuer, ")")
                   : "",
        " and requires a client certificate; this client has none: set RINGLOADER_TLS_CA, "
        "RINGLOADER_TLS_CERT and RINGLOADER_TLS_KEY (ringloaderctl: --tls-ca, --tls-cert, "
        "--tls-key)");
  }
  if (!probe.speaks_tls && have_tls) {
    return absl::StrCat("the daemon at ", endpoint,
                        " does not speak TLS (plaintext: server.insecure_tcp), but this client "
                        "was given certificates (RINGLOADER_TLS_*): give the daemon [tls], or "
                        "unset them");
  }
  if (!probe.speaks_tls) {
    return absl::StrCat("no connection (", endpoint,
                        " accepts connections, but ringloaderd does not answer)");
  }
  absl::StatusOr<base::TlsIdentity> ours = base::LoadTlsIdentity(**paths, NowSeconds());
  if (!ours.ok()) return std::string(ours.status().message());
  absl::StatusOr<base::PeerVerifier> verifier = base::PeerVerifier::Create(
      ours->ca_pem, {}, base::PeerVerifier::Role::kServer);
  if (!verifier.ok()) return std::string(verifier.status().message());
  if (absl::Status s = verifier->Verify(probe.leaf_pem, probe.chain_pem, NowSeconds(),
                                        "the daemon's certificate");
      !s.ok()) {
    return absl::StrCat("TLS to ", endpoint, " refused by this client: ", s.message(),
                        " (RINGLOADER_TLS_CA is ", (*paths)->ca, ")");
  }
  absl::StatusOr<base::CertificateFacts> facts = base::DescribeCertificate(probe.leaf_pem);
  const std::string expected = Env("RINGLOADER_TLS_SERVER_NAME").empty()
                                   ? host
                                   : Env("RINGLOADER_TLS_SERVER_NAME");
  return absl::StrCat(
      "TLS to ", endpoint, " failed: the daemon's certificate",
      facts.ok() ? absl::StrCat(" ", facts->subject, " (names: ",
                                facts->names.empty() ? "none" : absl::StrJoin(facts->names, ", "),
                                ")")
                 : "",
      " is signed by the CA, so is \"", expected,
      "\" among its names? (RINGLOADER_TLS_SERVER_NAME names the one to expect)");
}

}  // namespace

std::optional<bool> UnixSocketAccepts(const std::string& endpoint) {
  const std::string path = UnixSocketPath(endpoint);
  if (path.empty()) return std::nullopt;
  return ConnectUnix(path) == 0;
}

std::optional<pid_t> UnixSocketListenerPid(const std::string& endpoint) {
  const std::string path = UnixSocketPath(endpoint);
  if (path.empty()) return std::nullopt;
  std::optional<pid_t> pid;
  ConnectUnix(path, [&pid](int fd) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid > 0) {
      pid = cred.pid;
    }
  });
  return pid;
}

grpc::Status NoConnectionStatus(const std::string& endpoint) {
  const std::string path = UnixSocketPath(endpoint);
  const int err = path.empty() || path.size() >= sizeof(sockaddr_un{}.sun_path) ? 0
                                                                                : ConnectUnix(path);
  return grpc::Status(err == EACCES || err == EPERM ? grpc::StatusCode::PERMISSION_DENIED
                                                    : grpc::StatusCode::UNAVAILABLE,
                      DiagnoseNoConnection(endpoint));
}

std::string DiagnoseNoConnection(const std::string& endpoint) {
  const std::string path = UnixSocketPath(endpoint);
  if (path.empty()) {
    absl::StatusOr<std::string> target = GrpcTarget(endpoint);
    if (!target.ok()) return std::string(target.status().message());
    return DiagnoseTcp(*target);
  }
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::StrCat("socket path too long: ", path);
  }
  const int err = ConnectUnix(path);
  if (err == 0) return "no connection (the socket accepts connections, but ringloaderd does not answer)";
  if (err == EAGAIN) {
    return absl::StrCat("no connection: ", path,
                        " has a full backlog (ringloaderd is not accepting: stopped or overloaded?)");
  }
  if (err == EACCES || err == EPERM) {
    struct stat st {};
    std::string who = "the daemon's user";
    // The socket's own group; when its directory keeps us out (systemd's RuntimeDirectory,
    // mode 0750), that directory's group, which is the one to join.
    const std::string dir = path.substr(0, path.rfind('/') == 0 ? 1 : path.rfind('/'));
    if (::stat(path.c_str(), &st) == 0 || ::stat(dir.c_str(), &st) == 0) {
      if (const struct group* g = ::getgrgid(st.st_gid); g != nullptr) {
        who = absl::StrCat("members of group '", g->gr_name, "' (join with: sudo usermod -aG ",
                           g->gr_name, " $USER, then log in again)");
      }
    }
    return absl::StrCat("permission denied connecting to ", path, ": only ", who,
                        " may connect");
  }
  if (err == ENOENT) return absl::StrCat("no connection: ", path, " does not exist (is ringloaderd running?)");
  if (err == ECONNREFUSED) return absl::StrCat("no connection: nothing listens on ", path, " (is ringloaderd running?)");
  return absl::StrCat("no connection to ", path, ": ", std::strerror(err));
}

}  // namespace ringloader::client
