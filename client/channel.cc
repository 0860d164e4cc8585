// SPDX-License-Identifier: Apache-2.0
#include "client/channel.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target) {
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
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
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
  if (path.empty()) return "no connection (is ringloaderd running and the endpoint right?)";
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
