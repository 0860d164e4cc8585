// SPDX-License-Identifier: Apache-2.0
#pragma once
// A small PKI in a temp dir for the TLS tests, made with the openssl command as an operator
// would: CAs, and certificates they sign with chosen names, dates and uses.

#include <map>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace ringloader::testing {

class TestPki {
 public:
  struct Options {
    int days = 30;  // valid from now for this many days; -1: ended yesterday
    // openssl -addext lines beyond subjectAltName, e.g. "extendedKeyUsage=serverAuth".
    std::vector<std::string> extensions;
  };

  // A self-signed CA valid for `days`: Pem(name) and Key(name).
  void MakeCa(const std::string& name, const std::string& subject, int days = 3650);
  // A certificate for CN=`subject` with `sans` ("DNS:x,IP:127.0.0.1"), signed by CA `ca` (an
  // intermediate made by Issue with extensions "basicConstraints=critical,CA:TRUE" works too).
  void Issue(const std::string& name, const std::string& ca, const std::string& subject,
             const std::string& sans, Options options);
  void Issue(const std::string& name, const std::string& ca, const std::string& subject,
             const std::string& sans, int days) {
    Issue(name, ca, subject, sans, Options{days, {}});
  }

  std::string Pem(const std::string& name) const { return dir_.Join(name + ".pem"); }
  // A [tls] table serving certificate `name`, trusting CA "ca", with `extra` lines after it.
  std::string TlsTable(const std::string& name, const std::string& extra = "") const {
    return "[tls]\nca = \"" + Pem("ca") + "\"\ncert = \"" + Pem(name) + "\"\nkey = \"" + Key(name) +
           "\"\n" + extra;
  }
  std::string Key(const std::string& name) const { return dir_.Join(name + ".key"); }
  // RINGLOADER_TLS_CA / _CERT / _KEY for a client trusting `ca` and showing `name`.
  std::map<std::string, std::string> ClientEnv(const std::string& ca,
                                               const std::string& name) const;
  // The certificate's serial, as `openssl x509 -serial` prints it.
  std::string SerialOf(const std::string& name) const;

 private:
  // Runs openssl; aborts the test (REQUIRE) with its output when it fails.
  void Run(const std::vector<std::string>& args) const;
  TempDir dir_;
};

}  // namespace ringloader::testing
