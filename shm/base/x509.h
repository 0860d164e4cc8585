// SPDX-License-Identifier: Apache-2.0
#pragma once
// X.509 certificates for mutual TLS, checked the way people need to hear about them: which file,
// which certificate, and why ("certificate has expired", "not signed by the configured CA", "no
// allowed name"). Used by the daemon (its own files, and every client it is asked to trust), the
// client library and ringloaderctl (their files, and `doctor`). OpenSSL does the cryptography.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ringloader::base {

// What a certificate says about itself.
struct CertificateFacts {
  std::string subject;  // "CN=trainer-1,O=ml" (RFC 2253 order)
  std::string issuer;
  // Subject alternative names as "DNS:host", "IP:10.0.0.5", "URI:spiffe://...", "email:a@b".
  std::vector<std::string> names;
  int64_t not_before = 0;  // Unix seconds
  int64_t not_after = 0;
  // Whole and fractional days from `now` to not_after; negative once expired.
  double DaysLeft(int64_t now) const { return static_cast<double>(not_after - now) / 86400.0; }
};

// "2026-11-28 03:23:37 UTC".
std::string FormatUtc(int64_t unix_seconds);

// The three files of a TLS identity, with the config keys that named them (for messages).
struct TlsPaths {
  std::string ca, cert, key;
  std::string ca_key = "tls.ca", cert_key = "tls.cert", key_key = "tls.key";
  // false: only that each file reads, the key matches, and the CA file holds a certificate. A
  // client leaves the rest to the daemon, which then says what is wrong on both sides.
  bool check_chain = true;
};

// A loaded and checked identity: PEM text as gRPC takes it, and the facts of the certificate
// (the first of `cert`) and of the first CA certificate.
struct TlsIdentity {
  std::string ca_pem, cert_pem, key_pem;
  CertificateFacts cert, ca;
};

// Reads the files and checks them the way the other side will: each is readable PEM (at most
// 1 MiB), the key belongs to the certificate, and (check_chain) the certificate (with any
// intermediates after it in `cert`) chains to `ca` and is valid at `now`. Every error names the key, the path and why:
//   "tls.cert (/etc/ringloader/tls/host.pem): certificate has expired (CN=host, not after
//    2026-01-01 00:00:00 UTC)".
absl::StatusOr<TlsIdentity> LoadTlsIdentity(const TlsPaths& paths, int64_t now);

// The facts of the first certificate in `pem`.
absl::StatusOr<CertificateFacts> DescribeCertificate(std::string_view pem);

// A name pattern of an allow-list, checked: "TYPE:VALUE" with TYPE one of DNS, IP, URI, email
// (any case), or a bare DNS name. InvalidArgument naming the rule otherwise (an unknown type, an
// IP that is not an address, an empty value, a NUL).
absl::Status CheckNamePattern(std::string_view pattern);

// Whether the certificate name `name` ("DNS:a.b", as CertificateFacts::names has it) matches
// `pattern` (as CheckNamePattern takes it). DNS and email: no case, and '*' within one label (it
// never crosses a '.'); URI: '*' within one path segment (never crosses a '/'); IP: the same
// address, however written ("IP:2001:db8::1" matches the certificate's 2001:db8:0:0:0:0:0:1).
bool NameMatches(std::string_view pattern, std::string_view name);

// Decides whether a peer's certificate is one to trust: it chains to the CA bundle, is valid now
// and is meant for the peer's role (a client's certificate for TLS clients, a server's for
// servers: extendedKeyUsage and keyUsage, when present, must allow it; a CA certificate is never
// a peer), and, when an allow-list is given, one of its names matches one of the patterns
// (NameMatches). Thread-safe; cheap to copy.
class PeerVerifier {
 public:
  enum class Role { kClient, kServer };
  // InvalidArgument when `ca_pem` holds no certificate or a pattern is not one.
  static absl::StatusOr<PeerVerifier> Create(std::string_view ca_pem,
                                             std::vector<std::string> allowed_names,
                                             Role role = Role::kClient);

  // OK, or PermissionDenied saying why, naming the certificate (`*not_after` = its end, when it
  // checks out, for callers that cache the verdict):
  //   "client certificate CN=x (issuer CN=Other CA) is not signed by the configured CA
  //    (unable to get local issuer certificate)",
  //   "client certificate CN=x has expired (not after 2026-01-01 00:00:00 UTC)",
  //   "client certificate CN=x has no allowed name: it has DNS:mallory; allowed: DNS:trainer-*".
  // `chain_pem` may hold intermediates (and the leaf again); `who` starts the message.
  absl::Status Verify(std::string_view leaf_pem, std::string_view chain_pem, int64_t now,
                      const std::string& who = "client certificate",
                      int64_t* not_after = nullptr) const;

  const std::vector<std::string>& allowed_names() const { return allowed_; }

 private:
  struct Store;
  PeerVerifier(std::shared_ptr<Store> store, std::vector<std::string> allowed, Role role)
      : store_(std::move(store)), allowed_(std::move(allowed)), role_(role) {}
  std::shared_ptr<Store> store_;
  std::vector<std::string> allowed_;
  Role role_ = Role::kClient;
};

}  // namespace ringloader::base
