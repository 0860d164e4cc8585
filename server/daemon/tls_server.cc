// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/tls_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::Status WritePrivateFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace

// Checks each call's client certificate (see the header). A certificate found good is trusted
// for a minute (never past its end), so a connection's calls cost a map lookup and a certificate
// that expires, or a CA or allow-list that SIGHUP changed, is held to it again at once.
class ClientCertificateCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit ClientCertificateCheck(base::PeerVerifier verifier)
      : verifier_(std::make_shared<const base::PeerVerifier>(std::move(verifier))) {}

  bool IsBlocking() const override { return false; }  // a lookup, or one chain check

  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    const std::vector<grpc::string_ref> leaf =
        context->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
    const std::vector<grpc::string_ref> chain =
        context->FindPropertyValues(GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME);
    const std::string leaf_pem = leaf.empty() ? "" : std::string(leaf[0].data(), leaf[0].size());
    const std::string chain_pem =
        chain.empty() ? "" : std::string(chain[0].data(), chain[0].size());
    const absl::Status verdict = Check(leaf_pem, chain_pem);
    if (verdict.ok()) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(verdict.message()));
  }

  // OK, or Unauthenticated saying why ("ringloaderd refused this client: ..."), logged.
  absl::Status Check(const std::string& leaf_pem, const std::string& chain_pem) {
    const int64_t now = NowSeconds();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = trusted_.find(leaf_pem);
      if (it != trusted_.end() && it->second.until > now && it->second.generation == generation_) {
        return absl::OkStatus();
      }
    }
    // Checked outside the lock: other connections' calls do not wait for this one.
    std::shared_ptr<const base::PeerVerifier> verifier;
    uint64_t generation = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      verifier = verifier_;
      generation = generation_;
    }
    int64_t not_after = 0;
    const absl::Status verdict =
        verifier->Verify(leaf_pem, chain_pem, now, "client certificate", &not_after);
    bool log = false;
    uint64_t refused = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (verdict.ok()) {
        // Only trust is kept (a refused client pays a check per call, and cannot evict the
        // trusted ones by showing new certificates), for a minute at most and never past the
        // certificate's end.
        if (generation == generation_) {
          if (trusted_.size() >= kMaxTrusted) trusted_.clear();
          trusted_[leaf_pem] = Trusted{std::min(now + 60, not_after), generation};
        }
        return absl::OkStatus();
      }
      refused = ++refused_;
      last_refusal_ = std::string(verdict.message());
      // At most 10 lines a second in all: a client making a new certificate per call cannot
      // flood the log.
      if (now != log_second_) {
        log_second_ = now;
        logged_this_second_ = 0;
      }
      log = logged_this_second_++ < kMaxLogLinesPerSecond;
    }
    if (log) {
      SPDLOG_WARN("TLS: refused a client: {} ({} refused so far)", std::string(verdict.message()),
                  refused);
    }
    return absl::UnauthenticatedError(
        absl::StrCat("ringloaderd refused this client: ", verdict.message()));
  }

  void Replace(base::PeerVerifier verifier) {
    std::lock_guard<std::mutex> lock(mu_);
    verifier_ = std::make_shared<const base::PeerVerifier>(std::move(verifier));
    ++generation_;  // what the old CA or allow-list trusted is checked again
    trusted_.clear();
  }

  void Fill(v1::TlsStatus& status) const {
    std::lock_guard<std::mutex> lock(mu_);
    status.set_clients_refused(refused_);
    status.set_last_refusal(last_refusal_);
  }

 private:
  static constexpr size_t kMaxTrusted = 1024;
  static constexpr int kMaxLogLinesPerSecond = 10;
  struct Trusted {
    int64_t until = 0;
    uint64_t generation = 0;
  };
  mutable std::mutex mu_;
  std::shared_ptr<const base::PeerVerifier> verifier_;
  uint64_t generation_ = 0;
  std::map<std::string, Trusted> trusted_;  // leaf PEM -> until when
  uint64_t refused_ = 0;
  std::string last_refusal_;
  int64_t log_second_ = 0;
  int logged_this_second_ = 0;
};

TlsServer::TlsServer(std::string stage_dir, std::shared_ptr<ClientCertificateCheck> check)
    : stage_dir_(std::move(stage_dir)), check_(std::move(check)) {}

TlsServer::~TlsServer() = default;

absl::StatusOr<std::unique_ptr<TlsServer>> TlsServer::Start(const TlsConfig& config,
                                                             const std::string& stage_dir) {
  absl::StatusOr<base::TlsIdentity> identity =
      base::LoadTlsIdentity({config.ca, config.cert, config.key}, NowSeconds());
  if (!identity.ok()) return identity.status();
  absl::StatusOr<base::PeerVerifier> verifier =
      base::PeerVerifier::Create(identity->ca_pem, config.allowed_clients);
  if (!verifier.ok()) return verifier.status();
  std::error_code ec;
  std::filesystem::remove_all(stage_dir, ec);  // an earlier run's copies
  if (::mkdir(stage_dir.c_str(), 0700) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", stage_dir, " (for [tls]'s files): ", std::strerror(errno)));
  }
  std::unique_ptr<TlsServer> server(new TlsServer(
      stage_dir, std::make_shared<ClientCertificateCheck>(std::move(*verifier))));
  if (absl::Status s = server->Stage(*identity); !s.ok()) return s;
  server->identity_ = std::move(*identity);
  server->allowed_clients_ = config.allowed_clients;
  const std::string current = stage_dir + "/current";
  // Read now, then every second: a staged rotation is in use within about a second.
  server->provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      current + "/key.pem", current + "/cert.pem", current + "/ca.pem", 1);
  if (config.allowed_clients.empty()) {
    SPDLOG_WARN("TLS: [tls] allowed_clients is empty: any certificate the CA signed for a client "
                "may call this daemon; list the clients' names to narrow it");
  }
  SPDLOG_INFO("TLS: certificate {} ({:.0f} days left), CA {}, clients allowed: {}",
              server->identity_.cert.subject, server->identity_.cert.DaysLeft(NowSeconds()),
              server->identity_.ca.subject,
              config.allowed_clients.empty() ? "any the CA signed"
                                             : absl::StrJoin(config.allowed_clients, ", "));
  return server;
}

// Writes the set as <stage_dir>/<generation>/{ca,cert,key}.pem and points "current" at it with
// one rename, so the watcher reads the old set or the new, never a mixture; the set before is
// kept for a watcher still reading it.
absl::Status TlsServer::Stage(const base::TlsIdentity& identity) {
  const uint64_t generation = generation_ + 1;
  const std::string dir = absl::StrCat(stage_dir_, "/", generation);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (::mkdir(dir.c_str(), 0700) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  for (const auto& [name, text] : {std::pair<const char*, const std::string&>{"ca.pem",
                                                                               identity.ca_pem},
                                   {"cert.pem", identity.cert_pem},
                                   {"key.pem", identity.key_pem}}) {
    if (absl::Status s = WritePrivateFile(absl::StrCat(dir, "/", name), text); !s.ok()) return s;
  }
  // gRPC's watcher tells a change by the files' modification times, in whole seconds: a set
  // staged in the same second as the one before could be read half old, half new.
  while (NowSeconds() == last_staged_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string link = stage_dir_ + "/current";
  const std::string temp = stage_dir_ + "/current.new";
  ::unlink(temp.c_str());
  if (::symlink(std::to_string(generation).c_str(), temp.c_str()) != 0 ||
      ::rename(temp.c_str(), link.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot point ", link, " at ", dir, ": ", std::strerror(errno)));
  }
  if (generation >= 3) std::filesystem::remove_all(absl::StrCat(stage_dir_, "/", generation - 2), ec);
  generation_ = generation;
  last_staged_ = NowSeconds();
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> TlsServer::Credentials() {
  grpc::experimental::TlsServerCredentialsOptions options(provider_);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  // A certificate and proof of its key are required; whether it is one to trust is decided per
  // call by check_, which can say why (see the header).
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_BUT_DONT_VERIFY);
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(options);
  credentials->SetAuthMetadataProcessor(check_);
  return credentials;
}

absl::Status TlsServer::Reload(const TlsConfig& config) {
  absl::StatusOr<base::TlsIdentity> identity =
      base::LoadTlsIdentity({config.ca, config.cert, config.key}, NowSeconds());
  absl::StatusOr<base::PeerVerifier> verifier =
      identity.ok() ? base::PeerVerifier::Create(identity->ca_pem, config.allowed_clients)
                    : absl::StatusOr<base::PeerVerifier>(identity.status());
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status staged = verifier.ok() ? Stage(*identity) : verifier.status();
  if (!staged.ok()) {
    last_reload_error_ = std::string(staged.message());
    return staged;
  }
  check_->Replace(std::move(*verifier));
  identity_ = std::move(*identity);
  allowed_clients_ = config.allowed_clients;
  last_reload_error_.clear();
  ++reloads_;
  SPDLOG_INFO("TLS: reloaded: certificate {} ({:.0f} days left), CA {}", identity_.cert.subject,
              identity_.cert.DaysLeft(NowSeconds()), identity_.ca.subject);
  return absl::OkStatus();
}

absl::Status TlsServer::CheckClient(const std::string& leaf_pem, const std::string& chain_pem) {
  return check_->Check(leaf_pem, chain_pem);
}

base::TlsIdentity TlsServer::Identity(uint64_t* generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (generation != nullptr) *generation = generation_;
  return identity_;
}

uint64_t TlsServer::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

v1::TlsStatus TlsServer::Status() const {
  v1::TlsStatus status;
  const int64_t now = NowSeconds();
  {
    std::lock_guard<std::mutex> lock(mu_);
    status.set_cert_subject(identity_.cert.subject);
    status.set_cert_days_left(identity_.cert.DaysLeft(now));
    status.set_ca_subject(identity_.ca.subject);
    status.set_ca_days_left(identity_.ca.DaysLeft(now));
    for (const std::string& name : allowed_clients_) status.add_allowed_clients(name);
    status.set_reloads(reloads_);
    status.set_last_reload_error(last_reload_error_);
  }
  check_->Fill(status);
  return status;
}

}  // namespace ringloader::server
