// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/feed_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <new>

#include "absl/strings/str_cat.h"

namespace ringloader::server {
namespace {

// What one read() may bring: a host reads answers of many 16 KiB records; a feeder only
// requests (at most 64 KiB), so its hundreds of connections hold less.
constexpr size_t kDialReadBufferBytes = 256 << 10;
constexpr size_t kAcceptReadBufferBytes = 32 << 10;

// The first error OpenSSL queued on this thread, as its reason ("certificate verify failed"),
// and the queue cleared; `fallback` when there is none.
std::string TakeSslError(const std::string& fallback) {
  const unsigned long first = ERR_get_error();
  ERR_clear_error();
  if (first == 0) return fallback;
  const char* reason = ERR_reason_error_string(first);
  if (reason != nullptr) return reason;
  char text[256];
  ERR_error_string_n(first, text, sizeof(text));
  return text;
}

std::string PemOf(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return "";
  std::string pem;
  if (PEM_write_bio_X509(bio, cert) == 1) {
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    if (n > 0) pem.assign(data, static_cast<size_t>(n));
  }
  BIO_free(bio);
  return pem;
}

}  // namespace

std::string FeedPeerName(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "";
  char ip[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    return absl::StrCat("ipv4:", ip, ":", ntohs(a->sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&address);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {  // on a "[::]" listen: named as gRPC names it
      inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], ip, sizeof(ip));
      return absl::StrCat("ipv4:", ip, ":", ntohs(a->sin6_port));
    }
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
    return absl::StrCat("ipv6:[", ip, "]:", ntohs(a->sin6_port));
  }
  return "";
}

namespace {

int MillisecondsTo(FeedDeadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
}

void PutU32(uint8_t* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(in[i]) << (8 * i);
  return v;
}

// The read side of a connection's socket as OpenSSL sees it (a BIO of ours): what one read()
// brought is kept, and OpenSSL is handed exactly what it asks for (a record's header, then its
// body). OpenSSL's own read-ahead reads as much, but moves what is left of its buffer to the
// buffer's start before each record (to align the payload): with 256 KiB read at once that
// moved each answer's bytes several times over, the host's largest cost after AES (perf).
struct SocketReader {
  int fd;
  size_t capacity;
  std::unique_ptr<uint8_t[]> bytes;
  size_t begin = 0;
  size_t end = 0;
};

int ReaderRead(BIO* bio, char* out, int size) {
  auto* r = static_cast<SocketReader*>(BIO_get_data(bio));
  BIO_clear_retry_flags(bio);
  if (size <= 0) return 0;
  if (r->begin == r->end) {
    ssize_t n = 0;
    do {
      n = ::read(r->fd, r->bytes.get(), r->capacity);
    } while (n < 0 && errno == EINTR);
    if (n == 0) {
      BIO_set_flags(bio, BIO_FLAGS_IN_EOF);
      return 0;
    }
    if (n < 0) {  // errno stays for FeedConnection::Failed
      if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(bio);
      return -1;
    }
    r->begin = 0;
    r->end = static_cast<size_t>(n);
  }
  const size_t take = std::min(static_cast<size_t>(size), r->end - r->begin);
  std::memcpy(out, r->bytes.get() + r->begin, take);
  r->begin += take;
  return static_cast<int>(take);
}

long ReaderControl(BIO* bio, int command, long, void* ptr) {
  const auto* r = static_cast<const SocketReader*>(BIO_get_data(bio));
  switch (command) {
    case BIO_CTRL_PENDING:
      return static_cast<long>(r->end - r->begin);
    case BIO_CTRL_EOF:
      return BIO_test_flags(bio, BIO_FLAGS_IN_EOF) != 0 ? 1 : 0;
    case BIO_CTRL_FLUSH:
    case BIO_CTRL_PUSH:
    case BIO_CTRL_POP:
      return 1;
    case BIO_C_GET_FD:
      if (ptr != nullptr) *static_cast<int*>(ptr) = r->fd;
      return r->fd;
    default:
      return 0;
  }
}

int ReaderDestroy(BIO* bio) {
  delete static_cast<SocketReader*>(BIO_get_data(bio));
  BIO_set_data(bio, nullptr);
  return 1;
}

// `ssl` reads `fd` through a SocketReader of `capacity` bytes and writes it directly (a socket
// BIO: each SSL_write is one record's send()). False when OpenSSL could not allocate.
bool AttachSocket(SSL* ssl, int fd, size_t capacity) {
  static BIO_METHOD* const method = [] {
    // A descriptor's type: SSL_get_fd finds the socket through it (BIO_C_GET_FD).
    BIO_METHOD* m = BIO_meth_new(
        BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "feed socket reader");
    if (m != nullptr) {
      BIO_meth_set_read(m, ReaderRead);
      BIO_meth_set_ctrl(m, ReaderControl);
      BIO_meth_set_destroy(m, ReaderDestroy);
    }
    return m;
  }();
  if (method == nullptr) return false;
  std::unique_ptr<uint8_t[]> bytes(new (std::nothrow) uint8_t[capacity]);
  std::unique_ptr<SocketReader> reader(
      bytes ? new (std::nothrow) SocketReader{fd, capacity, std::move(bytes)} : nullptr);
  BIO* read = reader ? BIO_new(method) : nullptr;
  BIO* write = read != nullptr ? BIO_new_socket(fd, BIO_NOCLOSE) : nullptr;
  if (write == nullptr) {
    BIO_free(read);
    return false;
  }
  BIO_set_data(read, reader.release());
  BIO_set_init(read, 1);
  SSL_set_bio(ssl, read, write);  // owned by `ssl` from here
  return true;
}

// Only this protocol: a gRPC client (ALPN "h2") dialling the data port by mistake is refused
// in the handshake, not read as frames.
int SelectAlpn(SSL*, const unsigned char** out, unsigned char* out_length,
               const unsigned char* offered, unsigned int offered_length, void*) {
  const size_t ours = std::strlen(kFeedAlpn);
  for (unsigned int i = 0; i < offered_length;) {
    const unsigned int n = offered[i];
    if (i + 1 + n > offered_length) break;
    if (n == ours && std::memcmp(offered + i + 1, kFeedAlpn, n) == 0) {
      *out = offered + i + 1;
      *out_length = static_cast<unsigned char>(n);
      return SSL_TLSEXT_ERR_OK;
    }
    i += 1 + n;
  }
  return SSL_TLSEXT_ERR_ALERT_FATAL;
}

}  // namespace

absl::StatusOr<std::shared_ptr<SSL_CTX>> MakeFeedTlsContext(const base::TlsIdentity& identity,
                                                            bool server) {
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> context(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()),
                                   SSL_CTX_free);
  if (!context) return absl::InternalError("cannot make a TLS context: " + TakeSslError(""));
  SSL_CTX* ctx = context.get();
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // AUTO_RETRY (OpenSSL 3's default, said here since reads rely on it): a record that is not
  // data is read past, so SSL_read asks for the socket only when the reader's buffer is empty.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_AUTO_RETRY);
  const auto fail = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", TakeSslError("unreadable")));
  };
  // The certificate, then any intermediates after it.
  BIO* certs =
      BIO_new_mem_buf(identity.cert_pem.data(), static_cast<int>(identity.cert_pem.size()));
  bool first = true;
  while (X509* cert = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr)) {
    const int ok = first ? SSL_CTX_use_certificate(ctx, cert) : SSL_CTX_add0_chain_cert(ctx, cert);
    if (first || ok != 1) X509_free(cert);  // add0 took it when it succeeded
    if (ok != 1) {
      BIO_free(certs);
      return fail("tls.cert");
    }
    first = false;
  }
  BIO_free(certs);
  ERR_clear_error();  // the end of the PEM text
  if (first) return absl::InvalidArgumentError("tls.cert: holds no certificate");
  BIO* key_bio =
      BIO_new_mem_buf(identity.key_pem.data(), static_cast<int>(identity.key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  if (key == nullptr) return fail("tls.key");
  const int used = SSL_CTX_use_PrivateKey(ctx, key);
  EVP_PKEY_free(key);
  if (used != 1 || SSL_CTX_check_private_key(ctx) != 1) return fail("tls.key");
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  BIO* cas = BIO_new_mem_buf(identity.ca_pem.data(), static_cast<int>(identity.ca_pem.size()));
  int added = 0;
  while (X509* ca = PEM_read_bio_X509(cas, nullptr, nullptr, nullptr)) {
    added += X509_STORE_add_cert(store, ca) == 1 ? 1 : 0;
    X509_free(ca);
  }
  BIO_free(cas);
  ERR_clear_error();
  if (added == 0) return absl::InvalidArgumentError("tls.ca: holds no certificate");
  if (server) {
    // A certificate, and proof of its key, are required; whether to trust it is
    // TlsServer::CheckClient's to say, in words the host then reads (see the header).
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       [](int, X509_STORE_CTX*) { return 1; });
    SSL_CTX_set_alpn_select_cb(ctx, SelectAlpn, nullptr);
    SSL_CTX_set_num_tickets(ctx, 0);  // hosts do not resume sessions
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    std::string protos(1, static_cast<char>(std::strlen(kFeedAlpn)));
    protos += kFeedAlpn;
    SSL_CTX_set_alpn_protos(ctx, reinterpret_cast<const unsigned char*>(protos.data()),
                            static_cast<unsigned int>(protos.size()));
  }
  return context;
}

absl::StatusOr<std::unique_ptr<FeedConnection>> FeedConnection::Dial(const std::string& ip,
                                                                     const std::string& port,
                                                                     const std::string& tls_name,
                                                                     SSL_CTX* context,
                                                                     FeedDeadline deadline) {
  std::string host = ip;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(ip, ":", port, ": ", gai_strerror(rc)));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(found);
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  const int connected = connect(fd, found->ai_addr, found->ai_addrlen);
  const int connect_errno = errno;
  freeaddrinfo(found);
  const auto close_with = [fd](absl::Status why) {
    ::close(fd);
    return why;
  };
  if (connected != 0 && connect_errno != EINPROGRESS) {
    return close_with(absl::UnavailableError(
        absl::StrCat("cannot connect to ", ip, ":", port, ": ", std::strerror(connect_errno))));
  }
  if (connected != 0) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, MillisecondsTo(deadline)) != 1) {
      return close_with(absl::DeadlineExceededError(
          absl::StrCat("cannot connect to ", ip, ":", port, ": timed out")));
    }
    int error = 0;
    socklen_t length = sizeof(error);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) {
      return close_with(absl::UnavailableError(
          absl::StrCat("cannot connect to ", ip, ":", port, ": ", std::strerror(error))));
    }
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ERR_clear_error();
  SSL* ssl = SSL_new(context);
  if (ssl == nullptr) return close_with(absl::InternalError("SSL_new: " + TakeSslError("")));
  if (!AttachSocket(ssl, fd, kDialReadBufferBytes)) {
    SSL_free(ssl);
    return close_with(absl::InternalError("cannot make the socket's BIO: " + TakeSslError("")));
  }
  // The feeder's certificate must name the host as configured ([[feeders]] address).
  in6_addr ignored{};
  const bool is_ip = inet_pton(AF_INET, tls_name.c_str(), &ignored) == 1 ||
                     inet_pton(AF_INET6, tls_name.c_str(), &ignored) == 1;
  if (is_ip) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), tls_name.c_str());
  } else {
    SSL_set1_host(ssl, tls_name.c_str());
    SSL_set_tlsext_host_name(ssl, tls_name.c_str());
  }
  std::unique_ptr<FeedConnection> connection(
      new FeedConnection(fd, ssl, absl::StrCat(ip, ":", port)));
  while (true) {
    ERR_clear_error();
    const int ret = SSL_connect(ssl);
    if (ret == 1) break;
    const int error = SSL_get_error(ssl, ret);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      if (absl::Status s = connection->Await(error, deadline, "the TLS handshake"); !s.ok()) {
        return s;
      }
      continue;
    }
    const long verified = SSL_get_verify_result(ssl);
    if (verified != X509_V_OK) {
      return absl::UnauthenticatedError(
          absl::StrCat("the TLS handshake: the feeder's certificate for ", tls_name, ": ",
                       X509_verify_cert_error_string(verified)));
    }
    return connection->Failed(ret, "the TLS handshake");
  }
  const unsigned char* alpn = nullptr;
  unsigned int alpn_length = 0;
  SSL_get0_alpn_selected(ssl, &alpn, &alpn_length);
  if (alpn_length != std::strlen(kFeedAlpn) || std::memcmp(alpn, kFeedAlpn, alpn_length) != 0) {
    return absl::UnavailableError(
        absl::StrCat("the TLS handshake: ", ip, ":", port, " does not speak ", kFeedAlpn));
  }
  return connection;
}

absl::StatusOr<std::unique_ptr<FeedConnection>> FeedConnection::Accept(int fd, SSL_CTX* context,
                                                                       FeedDeadline deadline) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ERR_clear_error();
  SSL* ssl = SSL_new(context);
  if (ssl == nullptr || !AttachSocket(ssl, fd, kAcceptReadBufferBytes)) {
    SSL_free(ssl);
    ::close(fd);
    return absl::InternalError("cannot start TLS: " + TakeSslError("out of memory"));
  }
  std::unique_ptr<FeedConnection> connection(new FeedConnection(fd, ssl, FeedPeerName(fd)));
  while (true) {
    ERR_clear_error();
    const int ret = SSL_accept(ssl);
    if (ret == 1) return connection;
    const int error = SSL_get_error(ssl, ret);
    if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
      return connection->Failed(ret, "the TLS handshake");
    }
    if (absl::Status s = connection->Await(error, deadline, "the TLS handshake"); !s.ok()) {
      return s;
    }
  }
}

FeedConnection::~FeedConnection() {
  if (!shut_ && !broken_ && SSL_is_init_finished(ssl_)) {
    ERR_clear_error();
    SSL_shutdown(ssl_);  // close_notify, not waited for (non-blocking)
  }
  ERR_clear_error();
  SSL_free(ssl_);
  ::close(fd_);
}

absl::Status FeedConnection::Await(int error, FeedDeadline deadline, const char* doing) {
  pollfd p{fd_, static_cast<short>(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
  while (!shut_) {
    const int ready = poll(&p, 1, MillisecondsTo(deadline));
    if (ready > 0) return absl::OkStatus();  // ready, or an error SSL then reads
    if (ready < 0 && errno == EINTR) continue;
    broken_ = true;  // a record may be half written: no close_notify after it
    if (ready < 0) return absl::UnavailableError(absl::StrCat(doing, ": ", std::strerror(errno)));
    return absl::DeadlineExceededError(absl::StrCat(doing, ": timed out"));
  }
  broken_ = true;
  return absl::CancelledError(absl::StrCat(doing, ": given up"));
}

void FeedConnection::Close(FeedDeadline deadline) {
  // close_notify, then the write side shut: a peer whose request is still unread here must get
  // the last frame, not a reset that loses it (what close() with unread bytes would send).
  if (!shut_ && !broken_ && SSL_is_init_finished(ssl_)) {
    ERR_clear_error();
    SSL_shutdown(ssl_);
    ERR_clear_error();
  }
  broken_ = true;  // said already
  ::shutdown(fd_, SHUT_WR);
  // Bounded in time and bytes: a refused peer that keeps sending does not keep the thread.
  char discard[4096];
  size_t dropped = 0;
  pollfd p{fd_, POLLIN, 0};
  while (!shut_ && dropped < (64 << 10) && std::chrono::steady_clock::now() < deadline &&
         poll(&p, 1, MillisecondsTo(deadline)) > 0) {
    const ssize_t n = ::recv(fd_, discard, sizeof(discard), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;  // the peer closed too
    if (n > 0) dropped += static_cast<size_t>(n);
  }
}

absl::Status FeedConnection::Failed(int ret, const char* doing) {
  const int saved_errno = errno;
  const int error = SSL_get_error(ssl_, ret);
  broken_ = true;  // no close_notify after a fatal error
  if (shut_) {
    ERR_clear_error();
    return absl::CancelledError(absl::StrCat(doing, ": given up"));
  }
  switch (error) {
    case SSL_ERROR_ZERO_RETURN:
      ERR_clear_error();
      return absl::UnavailableError(absl::StrCat(doing, ": ", peer_, " closed the connection"));
    case SSL_ERROR_SYSCALL: {
      const std::string why =
          TakeSslError(saved_errno != 0 ? std::strerror(saved_errno) : "the connection ended");
      return absl::UnavailableError(absl::StrCat(doing, " with ", peer_, ": ", why));
    }
    default:
      return absl::UnavailableError(
          absl::StrCat(doing, " with ", peer_, ": ", TakeSslError("TLS failed")));
  }
}

absl::Status FeedConnection::Write(std::span<const uint8_t> bytes, FeedDeadline deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    ERR_clear_error();
    errno = 0;
    const int n = SSL_write(ssl_, bytes.data() + done,
                            static_cast<int>(std::min<size_t>(bytes.size() - done, 1 << 20)));
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int error = SSL_get_error(ssl_, n);
    if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) return Failed(n, "writing");
    if (absl::Status s = Await(error, deadline, "writing"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status FeedConnection::Read(
    std::span<uint8_t> into, FeedDeadline deadline,
    const std::function<absl::Status(std::span<const uint8_t>)>& each) {
  size_t done = 0;
  while (done < into.size()) {
    ERR_clear_error();
    errno = 0;
    const int n = SSL_read(ssl_, into.data() + done,
                           static_cast<int>(std::min<size_t>(into.size() - done, INT_MAX)));
    if (n > 0) {
      if (each) {
        if (absl::Status s = each(into.subspan(done, static_cast<size_t>(n))); !s.ok()) return s;
      }
      done += static_cast<size_t>(n);
      continue;
    }
    const int error = SSL_get_error(ssl_, n);
    if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) return Failed(n, "reading");
    if (absl::Status s = Await(error, deadline, "reading"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status FeedConnection::WriteFrame(uint32_t type, const google::protobuf::MessageLite& message,
                                        FeedDeadline deadline) {
  std::string frame(8, '\0');
  if (!message.AppendToString(&frame) || frame.size() - 8 > kMaxFrameBytes) {
    return absl::InternalError("a frame too large to send");
  }
  PutU32(reinterpret_cast<uint8_t*>(frame.data()), type);
  PutU32(reinterpret_cast<uint8_t*>(frame.data()) + 4, static_cast<uint32_t>(frame.size() - 8));
  return Write({reinterpret_cast<const uint8_t*>(frame.data()), frame.size()}, deadline);
}

absl::StatusOr<FeedConnection::Frame> FeedConnection::ReadFrame(FeedDeadline deadline,
                                                                uint32_t most) {
  uint8_t head[8];
  if (absl::Status s = Read(head, deadline); !s.ok()) return s;
  Frame frame;
  frame.type = GetU32(head);
  const uint32_t length = GetU32(head + 4);
  if (length > most) {
    broken_ = true;  // the rest of it is not read: the connection is out of step
    return absl::DataLossError(absl::StrCat("a frame of ", length, " bytes (at most ", most, ")"));
  }
  frame.bytes.resize(length);
  if (absl::Status s = Read({reinterpret_cast<uint8_t*>(frame.bytes.data()), length}, deadline);
      !s.ok()) {
    return s;
  }
  return frame;
}

bool FeedConnection::PeerSpoke() const {
  if (shut_ || broken_ || SSL_has_pending(ssl_) == 1 || BIO_ctrl_pending(SSL_get_rbio(ssl_)) > 0) {
    return true;
  }
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) != 0;
}

void FeedConnection::Cork(bool on) {
  const int value = on ? 1 : 0;
  setsockopt(fd_, IPPROTO_TCP, TCP_CORK, &value, sizeof(value));
}

void FeedConnection::Shutdown() {
  shut_ = true;
  ::shutdown(fd_, SHUT_RDWR);
}

std::string FeedConnection::PeerCertificatePem() const {
  X509* cert = SSL_get1_peer_certificate(ssl_);
  if (cert == nullptr) return "";
  std::string pem = PemOf(cert);
  X509_free(cert);
  return pem;
}

std::string FeedConnection::PeerChainPem() const {
  std::string pem;
  STACK_OF(X509)* chain = SSL_get_peer_cert_chain(ssl_);
  for (int i = 0; chain != nullptr && i < sk_X509_num(chain); ++i) {
    pem += PemOf(sk_X509_value(chain, i));
  }
  return pem;
}

}  // namespace ringloader::server
