// SPDX-License-Identifier: Apache-2.0
#pragma once
// The feed data plane: service Feeder's call over a TLS socket of our own, for a feeder with
// server.feeder_data_listen. Both ends use it: the feeder's FeedSocketServer and the host's
// FeederPool, which learns the port from a gRPC answer (FeedHeader.data_port) and sends its
// later calls there.
//
// Why not gRPC for the bytes: a sample crossed gRPC's TLS staging, HTTP/2 framing and a thread
// hop on each end, which cost the host about 0.23 ms a sample to receive (a quarter of decoding
// it) and the feeder 15% of its core to send (feeder_bench, perf). Here the host's TLS decrypts
// straight into the answer's buffer, which the filler copies into the ring slot, and the feeder
// encrypts straight from its answer.
//
// On the wire, after a TLS handshake (TLS 1.2 or later, ALPN "ringloader-feed/1", both sides'
// certificates required), calls follow one another on a connection, each:
//   host   -> feeder  frame kRequest: a FeedRequest
//   feeder -> host    frame kHeader: a FeedHeader, then exactly payload_bytes of payload
//                  or frame kError: a FeedError (the call's gRPC status code and why)
// A frame is 4 bytes of type and 4 of length (little-endian), then that many bytes, at most
// kMaxFrameBytes. Whether the client certificate is one to trust is decided after the
// handshake (TlsServer::CheckClient), so that a refused host hears why in a kError frame.

#include <openssl/ssl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"
#include "shm/base/x509.h"

namespace ringloader::server {

inline constexpr uint32_t kFeedFrameRequest = 0x51464c52;  // "RLFQ"
inline constexpr uint32_t kFeedFrameHeader = 0x48464c52;   // "RLFH"
inline constexpr uint32_t kFeedFrameError = 0x45464c52;    // "RLFE"
inline constexpr uint32_t kMaxFrameBytes = 1 << 20;
// A request frame: a FeedRequest of 256 indices and a spec is a few KiB.
inline constexpr uint32_t kMaxRequestBytes = 64 << 10;
inline constexpr char kFeedAlpn[] = "ringloader-feed/1";

using FeedDeadline = std::chrono::steady_clock::time_point;

// An SSL_CTX for either end, from a checked identity: the peer must show a certificate; a
// client (`server` false) checks the feeder's against the CA itself, a feeder leaves the
// client's to TlsServer::CheckClient.
absl::StatusOr<std::shared_ptr<SSL_CTX>> MakeFeedTlsContext(const base::TlsIdentity& identity,
                                                            bool server);

// The peer of socket `fd` as gRPC names one ("ipv4:1.2.3.4:5", "ipv6:[::1]:5"; a v4-mapped
// address as ipv4), for ClientKeyOfPeer; "" when it has none.
std::string FeedPeerName(int fd);

// One TLS connection of the data plane, used by one thread at a time (Shutdown excepted).
class FeedConnection {
 public:
  // Connects to `ip`:`port` (numeric) and handshakes, checking the feeder's certificate for
  // `tls_name` (a DNS name or an IP). Errors say which step failed and why.
  static absl::StatusOr<std::unique_ptr<FeedConnection>> Dial(const std::string& ip,
                                                              const std::string& port,
                                                              const std::string& tls_name,
                                                              SSL_CTX* context,
                                                              FeedDeadline deadline);
  // The feeder's side: the handshake on an accepted socket (taken over: closed with it).
  static absl::StatusOr<std::unique_ptr<FeedConnection>> Accept(int fd, SSL_CTX* context,
                                                                FeedDeadline deadline);
  ~FeedConnection();
  FeedConnection(const FeedConnection&) = delete;
  FeedConnection& operator=(const FeedConnection&) = delete;

  absl::Status WriteFrame(uint32_t type, const google::protobuf::MessageLite& message,
                          FeedDeadline deadline);
  absl::Status Write(std::span<const uint8_t> bytes, FeedDeadline deadline);
  // The next frame's type and bytes; DataLoss for one longer than `most` (the connection is
  // then done: the rest is not read).
  struct Frame {
    uint32_t type = 0;
    std::string bytes;
  };
  absl::StatusOr<Frame> ReadFrame(FeedDeadline deadline, uint32_t most = kMaxFrameBytes);
  // Exactly `into.size()` bytes; `each` sees them piece by piece as they are decrypted (while
  // in cache), and may stop the read by returning an error.
  absl::Status Read(std::span<uint8_t> into, FeedDeadline deadline,
                    const std::function<absl::Status(std::span<const uint8_t>)>& each = {});

  // Whether the peer has closed or sent what nobody asked for (poll, no wait), or the
  // connection failed: one idle in a pool is not reused then, and a feeder stops filling a call
  // its host left.
  bool PeerSpoke() const;
  // Holds what is written until Cork(false) or a full segment (TCP_CORK): a payload's 16 KiB
  // TLS records leave in 64 KiB segments, a quarter of the packets for both ends to handle.
  void Cork(bool on);
  // From any thread: wakes a read or write in progress, which fails; the connection is done.
  void Shutdown();
  // The feeder's end after a last frame: close_notify and the write side shut, then what the
  // peer still sends is read and dropped until it closes (or `deadline`), so that the frame
  // reaches it rather than a reset. The connection is done.
  void Close(FeedDeadline deadline);

  // The peer's certificate (and the chain it sent after it) as PEM, for checks and stats.
  std::string PeerCertificatePem() const;
  std::string PeerChainPem() const;
  const std::string& peer() const { return peer_; }  // "IP:PORT"
  std::chrono::steady_clock::time_point last_used{};

 private:
  FeedConnection(int fd, SSL* ssl, std::string peer) : fd_(fd), ssl_(ssl), peer_(std::move(peer)) {}
  // Waits for the socket as SSL asked (`error`: SSL_ERROR_WANT_READ or _WRITE) until `deadline`.
  absl::Status Await(int error, FeedDeadline deadline, const char* doing);
  absl::Status Failed(int ret, const char* doing);

  const int fd_;
  SSL* const ssl_;
  const std::string peer_;
  std::atomic<bool> shut_{false};
  bool broken_ = false;  // a read, write or handshake failed: the connection is done
};

}  // namespace ringloader::server
