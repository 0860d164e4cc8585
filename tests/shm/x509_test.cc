// SPDX-License-Identifier: Apache-2.0
// base::PeerVerifier and base::LoadTlsIdentity on certificates the openssl command makes: whom
// a daemon trusts as a client, and what it says about the rest.

#include "shm/base/x509.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "tests/support/test_pki.h"
#include "tests/support/test_support.h"

namespace ringloader::testing {
namespace {

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

base::PeerVerifier Verifier(const TestPki& pki, std::vector<std::string> allowed = {},
                            base::PeerVerifier::Role role = base::PeerVerifier::Role::kClient) {
  absl::StatusOr<base::PeerVerifier> v =
      base::PeerVerifier::Create(ReadFile(pki.Pem("ca")), std::move(allowed), role);
  REQUIRE(v.ok());
  return *v;
}

std::string Refusal(const base::PeerVerifier& v, const TestPki& pki, const std::string& name,
                    const std::string& chain = "") {
  const absl::Status s = v.Verify(ReadFile(pki.Pem(name)), chain, Now());
  return s.ok() ? "" : std::string(s.message());
}

}  // namespace

TEST_CASE("x509: a client certificate is trusted only for the role it was made for, and never a "
          "CA's",
          "[tls]") {
  TestPki pki;
  pki.MakeCa("ca", "Root");
  pki.Issue("client", "ca", "c", "DNS:c", TestPki::Options{30, {"extendedKeyUsage=clientAuth"}});
  pki.Issue("server", "ca", "s", "DNS:s", TestPki::Options{30, {"extendedKeyUsage=serverAuth"}});
  pki.Issue("plain", "ca", "p", "DNS:p", 30);  // no extendedKeyUsage: any use
  const base::PeerVerifier clients = Verifier(pki);
  CHECK(Refusal(clients, pki, "client").empty());
  CHECK(Refusal(clients, pki, "plain").empty());
  CHECK(Refusal(clients, pki, "server") ==
        "client certificate CN=s is not meant for a TLS client (its extendedKeyUsage or keyUsage "
        "says otherwise)");
  CHECK(Refusal(clients, pki, "ca") == "client certificate CN=Root is a CA certificate: a peer "
                                       "must show its own");
  const base::PeerVerifier servers = Verifier(pki, {}, base::PeerVerifier::Role::kServer);
  CHECK(Refusal(servers, pki, "server").empty());
  CHECK_THAT(Refusal(servers, pki, "client"), Catch::Contains("is not meant for a TLS server"));
}

TEST_CASE("x509: an intermediate in the peer's chain is used, and a missing one is named",
          "[tls]") {
  TestPki pki;
  pki.MakeCa("ca", "Root");
  pki.Issue("mid", "ca", "Intermediate", "",
            TestPki::Options{30, {"basicConstraints=critical,CA:TRUE",
                                  "keyUsage=critical,keyCertSign"}});
  pki.Issue("leaf", "mid", "leaf", "DNS:leaf", 30);
  const base::PeerVerifier v = Verifier(pki);
  CHECK(Refusal(v, pki, "leaf", ReadFile(pki.Pem("mid"))).empty());
  CHECK(Refusal(v, pki, "leaf") ==
        "client certificate CN=leaf (issuer CN=Intermediate) is not signed by the configured CA "
        "(unable to get local issuer certificate)");
}

TEST_CASE("x509: dates, and the reasons given", "[tls]") {
  TestPki pki;
  pki.MakeCa("ca", "Root");
  pki.MakeCa("other", "Other");
  pki.Issue("expired", "ca", "old", "DNS:old", -1);
  pki.Issue("stranger", "other", "s", "DNS:s", 30);
  const base::PeerVerifier v = Verifier(pki);
  CHECK_THAT(Refusal(v, pki, "expired"),
             Catch::StartsWith("client certificate CN=old has expired (not after "));
  CHECK(Refusal(v, pki, "stranger") ==
        "client certificate CN=s (issuer CN=Other) is not signed by the configured CA (unable to "
        "get local issuer certificate)");
  CHECK(v.Verify("", "", Now()).message() == "no client certificate was presented");
  // Days left.
  pki.Issue("month", "ca", "m", "DNS:m", 30);
  absl::StatusOr<base::CertificateFacts> facts = base::DescribeCertificate(ReadFile(pki.Pem("month")));
  REQUIRE(facts.ok());
  CHECK(facts->DaysLeft(Now()) > 29.9);
  CHECK(facts->DaysLeft(Now()) <= 30.0);
  CHECK(facts->names == std::vector<std::string>{"DNS:m"});
}

TEST_CASE("x509: allowed names: '*' stays within a DNS label or a URI segment, IPs compare as "
          "addresses, types are checked",
          "[tls]") {
  using base::NameMatches;
  CHECK(NameMatches("DNS:trainer-*", "DNS:trainer-1"));
  CHECK_FALSE(NameMatches("DNS:trainer-*", "DNS:trainer-1.other-team.corp"));
  CHECK(NameMatches("DNS:trainer-*.ml.corp", "DNS:Trainer-7.ML.corp"));
  CHECK(NameMatches("trainer-*.ml.corp", "DNS:trainer-7.ml.corp"));
  CHECK_FALSE(NameMatches("DNS:*.ml.corp", "DNS:a.b.ml.corp"));
  CHECK(NameMatches("URI:spiffe://ml/*", "URI:spiffe://ml/trainer"));
  CHECK_FALSE(NameMatches("URI:spiffe://ml/*", "URI:spiffe://ml/a/b"));
  CHECK(NameMatches("IP:2001:db8::1", "IP:2001:db8:0:0:0:0:0:1"));
  CHECK(NameMatches("ip:10.0.0.5", "IP:10.0.0.5"));
  CHECK_FALSE(NameMatches("IP:10.0.0.5", "IP:10.0.0.50"));
  CHECK_FALSE(NameMatches("IP:10.0.0.5", "DNS:10.0.0.5"));
  CHECK(NameMatches("email:ops@ml.corp", "email:OPS@ml.corp"));
  CHECK(base::CheckNamePattern("DNS:x").ok());
  CHECK(base::CheckNamePattern("Ip:::1").ok());
  CHECK(base::CheckNamePattern("host:x").message() ==
        "\"host:x\": unknown name type (use DNS:, IP:, URI: or email:)");
  CHECK(base::CheckNamePattern("IP:10.0.0.0/8").message() ==
        "\"IP:10.0.0.0/8\": not an IPv4 or IPv6 address (IP names match exactly)");
  CHECK_FALSE(base::CheckNamePattern("DNS:").ok());
  CHECK_FALSE(base::PeerVerifier::Create("-----BEGIN CERTIFICATE-----", {}).ok());

  // Through a certificate: the IP SAN as the certificate holds it.
  TestPki pki;
  pki.MakeCa("ca", "Root");
  pki.Issue("v6", "ca", "v6", "IP:2001:db8::1,DNS:trainer-1", 30);
  CHECK(Refusal(Verifier(pki, {"IP:2001:db8::1"}), pki, "v6").empty());
  CHECK(Refusal(Verifier(pki, {"DNS:trainer-*"}), pki, "v6").empty());
  CHECK(Refusal(Verifier(pki, {"DNS:mallory"}), pki, "v6") ==
        "client certificate CN=v6 has no allowed name: it has IP:2001:db8::1, DNS:trainer-1; "
        "allowed: DNS:mallory");
}

TEST_CASE("x509: LoadTlsIdentity names the file and why, and an encrypted key is an error, not "
          "a prompt",
          "[tls]") {
  TestPki pki;
  pki.MakeCa("ca", "Root");
  pki.Issue("daemon", "ca", "d", "DNS:d", 30);
  pki.Issue("other", "ca", "o", "DNS:o", 30);
  base::TlsPaths paths{pki.Pem("ca"), pki.Pem("daemon"), pki.Key("daemon")};
  absl::StatusOr<base::TlsIdentity> id = base::LoadTlsIdentity(paths, Now());
  REQUIRE(id.ok());
  CHECK(id->cert.subject == "CN=d");
  CHECK(id->ca.subject == "CN=Root");

  base::TlsPaths mismatched = paths;
  mismatched.key = pki.Key("other");
  CHECK(base::LoadTlsIdentity(mismatched, Now()).status().message() ==
        "tls.key (" + pki.Key("other") + "): is not the key of tls.cert (" + pki.Pem("daemon") +
            ") (CN=d): the pair does not match");
  base::TlsPaths missing = paths;
  missing.cert = "/nonexistent/cert.pem";
  CHECK(base::LoadTlsIdentity(missing, Now()).status().message() ==
        "tls.cert (/nonexistent/cert.pem): cannot read: No such file or directory");
  base::TlsPaths not_pem = paths;
  not_pem.ca = pki.Key("daemon") + ".txt";
  WriteFile(not_pem.ca, "hello");
  CHECK(base::LoadTlsIdentity(not_pem, Now()).status().message() ==
        "tls.ca (" + not_pem.ca + "): not PEM (no -----BEGIN line)");

  // An encrypted key with stdin closed: it must fail at once, naming the file.
  const std::string encrypted = pki.Key("daemon") + ".enc";
  REQUIRE(RunCommand({"/usr/bin/openssl", "pkey", "-in", pki.Key("daemon"), "-out", encrypted,
                      "-aes256", "-passout", "pass:secret"})
              .exit_code == 0);
  base::TlsPaths locked = paths;
  locked.key = encrypted;
  CHECK_THAT(std::string(base::LoadTlsIdentity(locked, Now()).status().message()),
             Catch::StartsWith("tls.key (" + encrypted + "): not an unencrypted PEM private key"));
}

}  // namespace ringloader::testing
