// SPDX-License-Identifier: Apache-2.0
#include "shm/base/x509.h"

#include <arpa/inet.h>
#include <fnmatch.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <utility>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ringloader::base {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

// OpenSSL's last error as text ("" when none), clearing the queue.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

std::vector<X509Ptr> ReadCertificates(std::string_view pem) {
  std::vector<X509Ptr> certs;
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return certs;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) certs.emplace_back(x);
  ERR_clear_error();  // the end of the text reads as "no start line"
  return certs;
}

std::string NameText(const X509_NAME* name) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_RFC2253 & ~ASN1_STRFLGS_ESC_MSB);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

int64_t UnixTime(const ASN1_TIME* time) {
  std::tm tm{};
  if (time == nullptr || ASN1_TIME_to_tm(time, &tm) != 1) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

std::vector<std::string> AltNames(X509* cert) {
  std::vector<std::string> names;
  auto* sans = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (sans == nullptr) return names;
  for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(sans, i);
    auto text = [](const ASN1_STRING* s) {
      return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                         static_cast<size_t>(ASN1_STRING_length(s)));
    };
    // A name with a NUL in it would read as a shorter one: it names nothing.
    auto add = [&names](const char* type, const std::string& value) {
      if (value.find('\0') == std::string::npos) names.push_back(absl::StrCat(type, ":", value));
    };
    switch (name->type) {
      case GEN_DNS: add("DNS", text(name->d.dNSName)); break;
      case GEN_URI: add("URI", text(name->d.uniformResourceIdentifier)); break;
      case GEN_EMAIL: add("email", text(name->d.rfc822Name)); break;
      case GEN_IPADD: {
        const std::string bytes = text(name->d.iPAddress);
        char buf[INET6_ADDRSTRLEN] = {};
        const int family = bytes.size() == 4 ? AF_INET : bytes.size() == 16 ? AF_INET6 : 0;
        if (family != 0 && ::inet_ntop(family, bytes.data(), buf, sizeof(buf)) != nullptr) {
          add("IP", buf);
        }
        break;
      }
      default: break;
    }
  }
  GENERAL_NAMES_free(sans);
  return names;
}

CertificateFacts FactsOf(X509* cert) {
  CertificateFacts facts;
  facts.subject = NameText(X509_get_subject_name(cert));
  facts.issuer = NameText(X509_get_issuer_name(cert));
  facts.names = AltNames(cert);
  facts.not_before = UnixTime(X509_get0_notBefore(cert));
  facts.not_after = UnixTime(X509_get0_notAfter(cert));
  return facts;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& key) {
  const std::string where = absl::StrCat(key, " (", path, ")");
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(key, ": is required"));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::Status(err == EACCES ? absl::StatusCode::kPermissionDenied
                                      : absl::StatusCode::kNotFound,
                        absl::StrCat(where, ": cannot read: ", std::strerror(err)));
  }
  std::string text(kMaxPemBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": larger than 1 MiB: not a PEM file"));
  }
  if (!absl::StrContains(text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not PEM (no -----BEGIN line)"));
  }
  return text;
}

// The X509 verification of `leaf` (with `untrusted` intermediates) against `store` at `now`:
// X509_V_OK or the error, with the certificate it concerns in `*failed`.
int VerifyChain(X509_STORE* store, X509* leaf, const std::vector<X509Ptr>& untrusted, int64_t now,
                int purpose, X509** failed) {
  STACK_OF(X509)* chain = sk_X509_new_null();
  for (const X509Ptr& c : untrusted) sk_X509_push(chain, c.get());
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  int result = X509_V_ERR_UNSPECIFIED;
  if (ctx != nullptr && X509_STORE_CTX_init(ctx, store, leaf, chain) == 1) {
    X509_STORE_CTX_set_time(ctx, 0, static_cast<time_t>(now));
    if (purpose != 0) X509_STORE_CTX_set_purpose(ctx, purpose);
    result = X509_verify_cert(ctx) == 1 ? X509_V_OK : X509_STORE_CTX_get_error(ctx);
    X509* current = X509_STORE_CTX_get_current_cert(ctx);
    *failed = current != nullptr ? current : leaf;
    if (*failed != nullptr) X509_up_ref(*failed);
  }
  X509_STORE_CTX_free(ctx);
  sk_X509_free(chain);
  ERR_clear_error();
  return result;
}

// "<who> CN=x has expired (not after ...)" and the like.
std::string DescribeFailure(int error, X509* leaf, X509* failed, const std::string& who) {
  const CertificateFacts facts = FactsOf(leaf);
  std::string subject = facts.subject.empty() ? "(no subject)" : facts.subject;
  const std::string about =
      failed != nullptr && X509_cmp(failed, leaf) != 0
          ? absl::StrCat(" (in its chain: ", NameText(X509_get_subject_name(failed)), ")")
          : "";
  switch (error) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return absl::StrCat(who, " ", subject, " has expired", about, " (not after ",
                          FormatUtc(FactsOf(failed != nullptr ? failed : leaf).not_after), ")");
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return absl::StrCat(who, " ", subject, " is not valid yet", about, " (not before ",
                          FormatUtc(FactsOf(failed != nullptr ? failed : leaf).not_before), ")");
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return absl::StrCat(who, " ", subject, " (issuer ", facts.issuer,
                          ") is not signed by the configured CA (",
                          X509_verify_cert_error_string(error), ")");
    default:
      return absl::StrCat(who, " ", subject, " is not valid", about, ": ",
                          X509_verify_cert_error_string(error));
  }
}

std::unique_ptr<X509_STORE, void (*)(X509_STORE*)> NewStore(
    const std::vector<X509Ptr>& authorities) {
  std::unique_ptr<X509_STORE, void (*)(X509_STORE*)> store(X509_STORE_new(), X509_STORE_free);
  for (const X509Ptr& ca : authorities) X509_STORE_add_cert(store.get(), ca.get());
  return store;
}

// "TYPE:VALUE" -> (canonical TYPE, VALUE); a bare name is DNS. nullopt for an unknown TYPE.
std::optional<std::pair<std::string, std::string>> SplitName(std::string_view pattern) {
  const size_t colon = pattern.find(':');
  if (colon == std::string_view::npos) return std::pair<std::string, std::string>{"DNS", std::string(pattern)};
  const std::string type = absl::AsciiStrToLower(std::string(pattern.substr(0, colon)));
  const std::string value(pattern.substr(colon + 1));
  for (const char* known : {"DNS", "IP", "URI", "email"}) {
    if (type == absl::AsciiStrToLower(known)) return std::pair<std::string, std::string>{known, value};
  }
  return std::nullopt;
}

// The 4 or 16 bytes of an IPv4 or IPv6 address; "" if `text` is neither.
std::string AddressBytes(const std::string& text) {
  unsigned char bytes[16];
  if (::inet_pton(AF_INET, text.c_str(), bytes) == 1) return std::string(reinterpret_cast<char*>(bytes), 4);
  if (::inet_pton(AF_INET6, text.c_str(), bytes) == 1) return std::string(reinterpret_cast<char*>(bytes), 16);
  return "";
}

// fnmatch where '*' stays within one `separator`-delimited part.
bool MatchParts(std::string pattern, std::string name, char separator) {
  if (separator != '/') {
    std::replace(pattern.begin(), pattern.end(), '/', '\x01');
    std::replace(name.begin(), name.end(), '/', '\x01');
    std::replace(pattern.begin(), pattern.end(), separator, '/');
    std::replace(name.begin(), name.end(), separator, '/');
  }
  return ::fnmatch(pattern.c_str(), name.c_str(), FNM_PATHNAME) == 0;
}

}  // namespace

absl::Status CheckNamePattern(std::string_view pattern) {
  const auto split = SplitName(pattern);
  if (!split) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", std::string(pattern), "\": unknown name type (use DNS:, IP:, URI: or email:)"));
  }
  if (split->second.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", std::string(pattern), "\": no name after the type"));
  }
  if (split->second.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("a name pattern must not hold a NUL");
  }
  if (split->first == "IP" && AddressBytes(split->second).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", std::string(pattern), "\": not an IPv4 or IPv6 address (IP names match exactly)"));
  }
  return absl::OkStatus();
}

bool NameMatches(std::string_view pattern_text, std::string_view name_text) {
  const auto pattern = SplitName(pattern_text);
  const auto name = SplitName(name_text);
  if (!pattern || !name || pattern->first != name->first) return false;
  if (pattern->first == "IP") {
    const std::string a = AddressBytes(pattern->second);
    return !a.empty() && a == AddressBytes(name->second);
  }
  if (pattern->first == "URI") return MatchParts(pattern->second, name->second, '/');
  // DNS names and email addresses are case-insensitive; '*' stays within a label.
  return MatchParts(absl::AsciiStrToLower(pattern->second), absl::AsciiStrToLower(name->second),
                    '.');
}

namespace {
}  // namespace

std::string FormatUtc(int64_t unix_seconds) {
  const time_t t = static_cast<time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[40];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

absl::StatusOr<CertificateFacts> DescribeCertificate(std::string_view pem) {
  std::vector<X509Ptr> certs = ReadCertificates(pem);
  if (certs.empty()) return absl::InvalidArgumentError("no certificate in the PEM text");
  return FactsOf(certs.front().get());
}

absl::StatusOr<TlsIdentity> LoadTlsIdentity(const TlsPaths& paths, int64_t now) {
  TlsIdentity id;
  absl::StatusOr<std::string> ca = ReadPem(paths.ca, paths.ca_key);
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadPem(paths.cert, paths.cert_key);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(paths.key, paths.key_key);
  if (!key.ok()) return key.status();
  const std::string ca_where = absl::StrCat(paths.ca_key, " (", paths.ca, ")");
  const std::string cert_where = absl::StrCat(paths.cert_key, " (", paths.cert, ")");
  const std::string key_where = absl::StrCat(paths.key_key, " (", paths.key, ")");

  std::vector<X509Ptr> authorities = ReadCertificates(*ca);
  if (authorities.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(ca_where, ": holds no certificate"));
  }
  std::vector<X509Ptr> chain = ReadCertificates(*cert);
  if (chain.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(cert_where, ": holds no certificate"));
  }
  BioPtr key_bio(BIO_new_mem_buf(key->data(), static_cast<int>(key->size())));
  // No passphrase prompt on the terminal: an encrypted key is an error, not a hang.
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(
      key_bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr);
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_where, ": not an unencrypted PEM private key (", OpenSslError(), ")"));
  }
  const bool matches = X509_check_private_key(chain.front().get(), pkey) == 1;
  EVP_PKEY_free(pkey);
  ERR_clear_error();
  if (!matches) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_where, ": is not the key of ", cert_where, " (", FactsOf(chain.front().get()).subject,
        "): the pair does not match"));
  }
  auto store = NewStore(authorities);
  X509* failed = nullptr;
  std::vector<X509Ptr> intermediates;
  for (size_t i = 1; i < chain.size(); ++i) {
    X509_up_ref(chain[i].get());
    intermediates.emplace_back(chain[i].get());
  }
  const int error = paths.check_chain ? VerifyChain(store.get(), chain.front().get(),
                                                    intermediates, now, 0, &failed)
                                      : X509_V_OK;
  X509Ptr failed_owner(failed);
  if (error != X509_V_OK) {
    return absl::InvalidArgumentError(absl::StrCat(
        cert_where, ": ", DescribeFailure(error, chain.front().get(), failed, "certificate"),
        error == X509_V_ERR_CERT_HAS_EXPIRED || error == X509_V_ERR_CERT_NOT_YET_VALID
            ? ""
            : absl::StrCat(" of ", ca_where)));
  }
  id.cert = FactsOf(chain.front().get());
  id.ca = FactsOf(authorities.front().get());
  id.ca_pem = std::move(*ca);
  id.cert_pem = std::move(*cert);
  id.key_pem = std::move(*key);
  return id;
}

struct PeerVerifier::Store {
  std::unique_ptr<X509_STORE, void (*)(X509_STORE*)> store{nullptr, X509_STORE_free};
};

absl::StatusOr<PeerVerifier> PeerVerifier::Create(std::string_view ca_pem,
                                                  std::vector<std::string> allowed_names,
                                                  Role role) {
  std::vector<X509Ptr> authorities = ReadCertificates(ca_pem);
  if (authorities.empty()) return absl::InvalidArgumentError("the CA bundle holds no certificate");
  auto store = std::make_shared<Store>();
  store->store = NewStore(authorities);
  for (std::string& pattern : allowed_names) {
    if (absl::Status s = CheckNamePattern(pattern); !s.ok()) return s;
    if (pattern.find(':') == std::string::npos) pattern = "DNS:" + pattern;
  }
  return PeerVerifier(std::move(store), std::move(allowed_names), role);
}

absl::Status PeerVerifier::Verify(std::string_view leaf_pem, std::string_view chain_pem,
                                  int64_t now, const std::string& who, int64_t* not_after) const {
  // The peer's bytes may leave errors in OpenSSL's per-thread queue, which gRPC's TLS on this
  // same thread expects empty: cleared on every way out.
  struct ClearErrors {
    ~ClearErrors() { ERR_clear_error(); }
  } clear_errors;
  std::vector<X509Ptr> leaf = ReadCertificates(leaf_pem);
  if (leaf.empty()) {
    return absl::PermissionDeniedError(absl::StrCat("no ", who, " was presented"));
  }
  const CertificateFacts facts = FactsOf(leaf.front().get());
  if (X509_check_ca(leaf.front().get()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        who, " ", facts.subject, " is a CA certificate: a peer must show its own"));
  }
  std::vector<X509Ptr> untrusted = ReadCertificates(chain_pem);
  X509* failed = nullptr;
  const int purpose = role_ == Role::kClient ? X509_PURPOSE_SSL_CLIENT : X509_PURPOSE_SSL_SERVER;
  const int error =
      VerifyChain(store_->store.get(), leaf.front().get(), untrusted, now, purpose, &failed);
  X509Ptr failed_owner(failed);
  if (error == X509_V_ERR_INVALID_PURPOSE) {
    return absl::PermissionDeniedError(absl::StrCat(
        who, " ", facts.subject, " is not meant for a TLS ",
        role_ == Role::kClient ? "client" : "server",
        " (its extendedKeyUsage or keyUsage says otherwise)"));
  }
  if (error != X509_V_OK) {
    return absl::PermissionDeniedError(DescribeFailure(error, leaf.front().get(), failed, who));
  }
  if (not_after != nullptr) *not_after = facts.not_after;
  if (allowed_.empty()) return absl::OkStatus();
  for (const std::string& name : facts.names) {
    for (const std::string& pattern : allowed_) {
      if (NameMatches(pattern, name)) return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      who, " ", facts.subject, " has no allowed name: it has ",
      facts.names.empty() ? "no subject alternative names" : absl::StrJoin(facts.names, ", "),
      "; allowed: ", absl::StrJoin(allowed_, ", ")));
}

}  // namespace ringloader::base
