// SPDX-License-Identifier: Apache-2.0
#pragma once
// The daemon's side of mutual TLS ([tls]): credentials for its TCP endpoints, the check of every
// client certificate, and certificate rotation on SIGHUP.
//
// Why the client check is ours, not the TLS library's: a client refused inside the handshake
// learns only "socket closed". So TLS requires a client certificate and proof of its key, and
// every call is then checked here (base::PeerVerifier: chains to [tls] ca, valid now, an allowed
// name) and refused UNAUTHENTICATED with the reason: the client reads "client certificate CN=x
// has expired (not after ...)", and the daemon's log says the same with the peer's address.
//
// Rotation: the files are read and checked (base::LoadTlsIdentity) and copied into a directory
// of their own under state_dir that gRPC's file watcher reads (within a second); a set that does
// not check out is refused and the running one kept, so a half-written certificate or a key
// that does not match never reaches a handshake.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "proto/ringloader.pb.h"
#include "server/daemon/config.h"
#include "shm/base/x509.h"

namespace grpc::experimental {
class CertificateProviderInterface;
}

namespace ringloader::server {

class ClientCertificateCheck;

class TlsServer {
 public:
  // Checks `config`'s files and stages them in `stage_dir` (created, 0700). Errors name the
  // config key, the file and why ("tls.key (/etc/...): is not the key of tls.cert ...").
  static absl::StatusOr<std::unique_ptr<TlsServer>> Start(const TlsConfig& config,
                                                          const std::string& stage_dir);
  ~TlsServer();

  // Credentials for one listening port (each port takes its own; they share the certificates).
  std::shared_ptr<grpc::ServerCredentials> Credentials();

  // SIGHUP: the files named by `config` again (paths and allowed_clients may change). A set that
  // does not check out changes nothing and is returned as the error.
  absl::Status Reload(const TlsConfig& config);

  // For GetStats (days left counted from now).
  v1::TlsStatus Status() const;

  // The feed data plane's (feed_socket.h), which does its own TLS: the client check every call
  // gets (OK, or Unauthenticated saying why, logged and counted as for gRPC), and the identity
  // as last (re)loaded, with its generation (it changes with each reload taken).
  absl::Status CheckClient(const std::string& leaf_pem, const std::string& chain_pem);
  base::TlsIdentity Identity(uint64_t* generation) const;
  uint64_t generation() const;

 private:
  TlsServer(std::string stage_dir, std::shared_ptr<ClientCertificateCheck> check);
  absl::Status Stage(const base::TlsIdentity& identity);

  const std::string stage_dir_;
  std::shared_ptr<ClientCertificateCheck> check_;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
  mutable std::mutex mu_;
  base::TlsIdentity identity_;  // as staged
  std::vector<std::string> allowed_clients_;
  uint64_t generation_ = 0;
  int64_t last_staged_ = 0;  // Unix seconds
  uint64_t reloads_ = 0;
  std::string last_reload_error_;
};

}  // namespace ringloader::server
