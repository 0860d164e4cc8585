// SPDX-License-Identifier: Apache-2.0
#pragma once
// Endpoint strings and the gRPC channel every ringloader client uses (the library and
// ringloaderctl alike). Internal to client/ (includes gRPC).

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "shm/base/x509.h"

namespace ringloader::client {

// The gRPC target for a ringloader endpoint:
//   "unix:/abs/path.sock", "unix:rel/path.sock", "unix:///abs/path.sock"  -> "unix:<path>"
//   "/abs/path.sock" (a bare absolute path)                                -> "unix:/abs/path.sock"
//   "host:port", "[v6addr]:port"                                            -> unchanged
// InvalidArgument naming the endpoint otherwise (empty, empty path, "unix://host/..." with an
// authority, missing or non-numeric port, port out of 1..65535).
absl::StatusOr<std::string> GrpcTarget(absl::string_view endpoint);

// The files of this process' TLS identity, from the environment: RINGLOADER_TLS_CA,
// RINGLOADER_TLS_CERT, RINGLOADER_TLS_KEY (all three, or none: InvalidArgument naming what is
// missing). nullopt when none is set.
absl::StatusOr<std::optional<base::TlsPaths>> TlsPathsFromEnvironment();

// A channel to `target` (from GrpcTarget). A Unix socket is plaintext (the kernel checks who
// connects). TCP is mutual TLS when TlsPathsFromEnvironment names files (the daemon's
// certificate checked against the CA and the target's host; RINGLOADER_TLS_SERVER_NAME names
// another host to expect), else plaintext. Errors name an unreadable or mismatched file.
// Tuned for a daemon on the same host:
// reconnect backoff 10..250 ms (gRPC's default starts at 1 s and grows to 120 s, far too slow to
// follow a restarting daemon), keepalive pings every 10 s during calls (5 s timeout) so a hung
// peer is noticed, and a private subchannel pool so one Client's backoff state is its own.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target);

// For a Unix socket endpoint: whether something accepts connections on it now (one non-blocking
// connect(), closed at once; a full backlog counts as not accepting); nullopt for other endpoints.
std::optional<bool> UnixSocketAccepts(const std::string& endpoint);

// The process that listens on a Unix socket endpoint, as the kernel names it (SO_PEERCRED);
// nullopt for other endpoints, when nothing accepts, or for a process in another pid namespace.
std::optional<pid_t> UnixSocketListenerPid(const std::string& endpoint);

// Why nothing answers at `endpoint`, for "no connection" messages. For a Unix socket, what a
// connect() says: "permission denied connecting to PATH: only members of group 'G' may connect
// (join with: sudo usermod -aG G $USER ...)", "PATH does not exist (is ringloaderd running?)", ...
// For TCP, what a TLS handshake of its own finds: a daemon speaking TLS to a client without
// certificates, one speaking plaintext to a client with them, or a daemon's certificate that
// this client's CA did not sign (naming it and why).
std::string DiagnoseNoConnection(const std::string& endpoint);

// The status for "nothing answers at `endpoint`": PERMISSION_DENIED when the Unix socket's
// permissions keep this process out (waiting cannot change that, so it is never retried),
// else UNAVAILABLE. Its message is DiagnoseNoConnection's.
grpc::Status NoConnectionStatus(const std::string& endpoint);

}  // namespace ringloader::client
