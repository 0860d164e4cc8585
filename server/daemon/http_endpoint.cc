// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/http_endpoint.h"

#include "server/daemon/config.h"

#include <algorithm>

#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ringloader::server {
namespace {

MHD_Result Queue(MHD_Connection* connection, unsigned status, const std::string& body,
                 const std::string& content_type) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type.c_str());
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  }
  const MHD_Result queued = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& listen,
                                                                   std::vector<Page> pages,
                                                                   unsigned max_connections) {
  std::string host, port;
  if (!SplitHostPort(listen, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("'", listen, "' is not HOST:PORT"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (", gai_strerror(rc), ")"));
  }
  auto endpoint = std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(pages)));
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL;
  if (found->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  const MHD_AccessHandlerCallback handler =
      [](void* cls, MHD_Connection* connection, const char* url, const char* method,
         const char*, const char*, size_t* upload_size, void**) -> MHD_Result {
    const HttpEndpoint& self = *static_cast<const HttpEndpoint*>(cls);
    if (*upload_size != 0) {  // a body we do not want: drop it and answer
      *upload_size = 0;
      return MHD_YES;
    }
    const auto page = std::find_if(self.pages_.begin(), self.pages_.end(),
                                   [&](const Page& p) { return p.path == url; });
    if (page == self.pages_.end()) {
      std::vector<std::string> paths;
      for (const Page& p : self.pages_) paths.push_back(p.path);
      return Queue(connection, MHD_HTTP_NOT_FOUND,
                   absl::StrCat("not found: ", absl::StrJoin(paths, " and "), " are served\n"),
                   "text/plain; charset=utf-8");
    }
    if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
      return Queue(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n",
                   "text/plain; charset=utf-8");
    }
    return Queue(connection, MHD_HTTP_OK, page->respond(), page->content_type);
  };
  endpoint->daemon_ = MHD_start_daemon(
      flags, 0, nullptr, nullptr, handler, endpoint.get(), MHD_OPTION_SOCK_ADDR, found->ai_addr,
      MHD_OPTION_CONNECTION_LIMIT, std::clamp(max_connections, 1u, kMaxConnections),
      MHD_OPTION_CONNECTION_TIMEOUT,
      kIdleTimeoutSeconds, MHD_OPTION_END);
  ::freeaddrinfo(found);
  if (endpoint->daemon_ == nullptr) {  // (libmicrohttpd does not say why; errno is not reliable)
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (address in use, or not permitted?)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(endpoint->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  endpoint->port_ = info != nullptr ? info->port : 0;
  return endpoint;
}

HttpEndpoint::~HttpEndpoint() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace ringloader::server
