// SPDX-License-Identifier: Apache-2.0
#include "tests/support/test_pki.h"

#include <catch2/catch.hpp>

namespace ringloader::testing {

void TestPki::Run(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  const CommandResult r = RunCommand(argv);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

void TestPki::MakeCa(const std::string& name, const std::string& subject, int days) {
  Run({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", Key(name), "-out", Pem(name), "-subj", "/CN=" + subject, "-days",
       std::to_string(days)});
}

void TestPki::Issue(const std::string& name, const std::string& ca, const std::string& subject,
                    const std::string& sans, Options options) {
  const std::string csr = dir_.Join(name + ".csr");
  std::vector<std::string> request = {"req", "-new", "-newkey", "ec", "-pkeyopt",
                                      "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                                      Key(name), "-out", csr, "-subj", "/CN=" + subject};
  if (!sans.empty()) {
    request.push_back("-addext");
    request.push_back("subjectAltName=" + sans);
  }
  for (const std::string& extension : options.extensions) {
    request.push_back("-addext");
    request.push_back(extension);
  }
  Run(request);
  Run({"x509", "-req", "-in", csr, "-CA", Pem(ca), "-CAkey", Key(ca), "-CAcreateserial", "-out",
       Pem(name), "-days", std::to_string(options.days), "-copy_extensions", "copy"});
}

std::map<std::string, std::string> TestPki::ClientEnv(const std::string& ca,
                                                      const std::string& name) const {
  return {{"RINGLOADER_TLS_CA", Pem(ca)},
          {"RINGLOADER_TLS_CERT", Pem(name)},
          {"RINGLOADER_TLS_KEY", Key(name)}};
}

std::string TestPki::SerialOf(const std::string& name) const {
  return RunCommand({"/usr/bin/openssl", "x509", "-in", Pem(name), "-noout", "-serial"}).output;
}

}  // namespace ringloader::testing
