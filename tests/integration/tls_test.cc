// SPDX-License-Identifier: Apache-2.0
// Mutual TLS on a TCP listen ([tls], issue 40 item 2), through the real ringloaderd and
// ringloaderctl, with certificates this test makes with the openssl command: a trusted client is
// served; a client of another CA, an expired one, one with a name not allowed and a plaintext
// one get nothing, and both sides say why. Certificates rotate on SIGHUP; a bad set is refused
// and the running one kept; days to expiry are in stats, /metrics and doctor.

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <string>
#include <vector>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/delay_mount.h"
#include "tests/integration/scrape.h"
#include "tests/support/test_pki.h"
#include "tests/support/test_support.h"

namespace ringloader::testing {
namespace {

using Pki = TestPki;

CommandResult Ctl(const DaemonFixture& daemon, const std::map<std::string, std::string>& env,
                  std::vector<std::string> args) {
  std::vector<std::string> argv = {CtlPath(), "--endpoint", daemon.endpoint()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, env, std::chrono::seconds(60));
}

// The serial of the certificate the daemon shows a new connection now (openssl s_client).
std::string ServedSerial(const DaemonFixture& daemon, const Pki& pki) {
  const std::string host_port = daemon.endpoint();
  const CommandResult r = RunCommand(
      {"/bin/sh", "-c",
       "openssl s_client -connect " + host_port + " -CAfile " + pki.Pem("ca") + " -cert " +
           pki.Pem("trainer") + " -key " + pki.Key("trainer") +
           " </dev/null 2>/dev/null | openssl x509 -noout -serial"});
  return r.output;
}

}  // namespace

TEST_CASE("mutual TLS: a trusted client is served, others get nothing and both sides say why",
          "[tls]") {
  Pki pki;
  pki.MakeCa("ca", "ringloader test CA");
  pki.MakeCa("other", "Other CA");
  // The daemon's certificate runs out in 5 days: doctor must say so (and, after a rotation,
  // no longer).
  pki.Issue("daemon", "ca", "ringloaderd", "DNS:localhost,IP:127.0.0.1", 5);
  pki.Issue("trainer", "ca", "trainer-1", "DNS:trainer-1", 30);
  pki.Issue("stranger", "other", "trainer-1", "DNS:trainer-1", 30);
  pki.Issue("expired", "ca", "trainer-2", "DNS:trainer-2", -1);
  pki.Issue("mallory", "ca", "mallory", "DNS:mallory", 30);

  const std::string metrics = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.tcp = true;
  options.images = 48;
  options.server_extra = "metrics_listen = \"" + metrics + "\"";
  options.config_extra = pki.TlsTable("daemon", "allowed_clients = [\"DNS:trainer-*\"]\n");
  const auto trainer = pki.ClientEnv("ca", "trainer");
  options.ctl_env = trainer;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  INFO(daemon.Log());

  // The trusted client: health, stats with the TLS line, and batches through the client library.
  CommandResult ok = Ctl(daemon, trainer, {"stats"});
  REQUIRE(ok.exit_code == 0);
  CHECK_THAT(ok.output, Catch::Contains("certificate CN=ringloaderd, 5 days left"));
  CommandResult consumed = Ctl(daemon, trainer,
                               {"consume", "--dataset", "synth", "--batch-size", "8",
                                "--image-size", "32", "--max-batches", "4"});
  INFO(consumed.output);
  CHECK(consumed.exit_code == 0);
  // The staged copy of the key is the daemon's alone.
  struct stat st {};
  REQUIRE(::stat((daemon.state_dir() + "/tls/current/key.pem").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  struct Refused {
    const char* what;
    std::map<std::string, std::string> env;
    const char* client_says;  // in ringloaderctl's error
    const char* daemon_says;  // in the daemon's log
  };
  const std::vector<Refused> refused = {
      {"another CA", pki.ClientEnv("ca", "stranger"),
       "client certificate CN=trainer-1 (issuer CN=Other CA) is not signed by the configured CA",
       "TLS: refused a client: client certificate CN=trainer-1 (issuer CN=Other CA) is not "
       "signed"},
      {"expired", pki.ClientEnv("ca", "expired"), "client certificate CN=trainer-2 has expired",
       "TLS: refused a client: client certificate CN=trainer-2 has expired"},
      {"a name not allowed", pki.ClientEnv("ca", "mallory"),
       "client certificate CN=mallory has no allowed name: it has DNS:mallory; allowed: "
       "DNS:trainer-*",
       "TLS: refused a client: client certificate CN=mallory has no allowed name"},
      {"plaintext", {{"RINGLOADER_TLS_CA", ""}}, "speaks TLS",
       "a client spoke plaintext to this TLS endpoint"},
  };
  for (const Refused& r : refused) {
    INFO(r.what);
    for (const char* command : {"stats", "health"}) {
      const CommandResult result = Ctl(daemon, r.env, {command});
      INFO(command << ": " << result.output);
      CHECK(result.exit_code != 0);
      CHECK_THAT(result.output, Catch::Contains(r.client_says));
      // Nothing of the daemon's leaks into a refused answer.
      CHECK_THAT(result.output, !Catch::Contains("streams_open"));
      CHECK_THAT(result.output, !Catch::Contains("SERVING"));
    }
    CHECK(WaitFor([&] { return daemon.Log().find(r.daemon_says) != std::string::npos; },
                  std::chrono::seconds(10)));
  }
  // A refused client cannot open a stream either (the client library says why).
  const CommandResult stream = Ctl(daemon, pki.ClientEnv("ca", "mallory"),
                                   {"consume", "--dataset", "synth", "--max-batches", "1"});
  CHECK(stream.exit_code != 0);
  CHECK_THAT(stream.output, Catch::Contains("has no allowed name"));

  // A client that trusts another CA refuses the daemon, naming its certificate.
  const CommandResult distrust = Ctl(daemon, pki.ClientEnv("other", "stranger"), {"stats"});
  CHECK(distrust.exit_code != 0);
  CHECK_THAT(distrust.output,
             Catch::Contains("the daemon's certificate CN=ringloaderd (issuer CN=ringloader test "
                             "CA) is not signed by the configured CA"));

  // Refusals are counted; days left in stats, /metrics and doctor.
  const CommandResult json = Ctl(daemon, trainer, {"stats", "--json"});
  REQUIRE(json.exit_code == 0);
  CHECK_THAT(json.output, Catch::Contains("\"cert_days_left\""));
  const CommandResult scraped = Scrape(metrics);
  REQUIRE(scraped.exit_code == 0);
  const std::optional<double> days =
      Value(scraped.output, "ringloader_tls_certificate_days_left{certificate=\"cert\"}");
  REQUIRE(days.has_value());
  CHECK(*days > 4.9);
  CHECK(*days < 5.01);
  // The series deploy/prometheus/ringloader-rules.yml alerts on (monitoring_test has no TLS).
  const std::string rules = ReadFile(std::string(RINGLOADER_SOURCE_DIR) +
                                     "/deploy/prometheus/ringloader-rules.yml");
  for (const char* series : {"ringloader_tls_certificate_days_left", "ringloader_tls_reload_failed"}) {
    INFO(series);
    CHECK_THAT(rules, Catch::Contains(series));
    CHECK_THAT(scraped.output, Catch::Contains(std::string("\n") + series));
  }
  const std::optional<double> refusals = Value(scraped.output, "ringloader_tls_clients_refused_total");
  REQUIRE(refusals.has_value());
  CHECK(*refusals >= 3);
  const CommandResult doctor_live = Ctl(daemon, trainer, {"doctor", "--live"});
  CHECK_THAT(doctor_live.output, Catch::Contains("daemon TLS: certificate CN=ringloaderd, 5 days left"));
  CHECK_THAT(doctor_live.output, Catch::Contains("renew the certificate"));
  CHECK(doctor_live.exit_code != 0);
  const CommandResult doctor_config = RunCommand({CtlPath(), "doctor", "--config", daemon.config_path()});
  CHECK_THAT(doctor_config.output, Catch::Contains("[tls]: certificate CN=ringloaderd valid, 5 days left"));

  // Rotation: a new certificate at the same path and SIGHUP; new connections see it.
  const std::string old_serial = pki.SerialOf("daemon");
  CHECK(ServedSerial(daemon, pki) == old_serial);
  pki.Issue("daemon", "ca", "ringloaderd", "DNS:localhost,IP:127.0.0.1", 300);
  const std::string new_serial = pki.SerialOf("daemon");
  REQUIRE(new_serial != old_serial);
  daemon.process().Kill(SIGHUP);
  CHECK(WaitFor([&] { return ServedSerial(daemon, pki) == new_serial; }, std::chrono::seconds(15)));
  CHECK(WaitFor([&] { return daemon.Log().find("reload: applied: [tls] certificates") != std::string::npos; },
                std::chrono::seconds(10)));
  CommandResult rotated = Ctl(daemon, trainer, {"stats"});
  CHECK_THAT(rotated.output, Catch::Contains("certificate CN=ringloaderd, 300 days left"));
  CHECK(Ctl(daemon, trainer, {"doctor", "--live"}).exit_code == 0);

  // A bad set (a key that is not the certificate's) is refused; the running one keeps serving.
  const std::string good_key = ReadFile(pki.Key("daemon"));
  WriteFile(pki.Key("daemon"), ReadFile(pki.Key("trainer")));
  daemon.process().Kill(SIGHUP);
  CHECK(WaitFor([&] { return daemon.Log().find("keeping the running certificates") != std::string::npos; },
                std::chrono::seconds(10)));
  CHECK_THAT(daemon.Log(), Catch::Contains("is not the key of tls.cert"));
  CommandResult after_bad = Ctl(daemon, trainer, {"stats"});
  CHECK(after_bad.exit_code == 0);
  CHECK_THAT(after_bad.output, Catch::Contains("the latest SIGHUP's files were refused"));
  // Nothing of the bad set was staged for gRPC's watcher: "current" still names the good one.
  CHECK(ReadFile(daemon.state_dir() + "/tls/current/key.pem") == good_key);
  CHECK(ServedSerial(daemon, pki) == new_serial);
  CHECK(Value(Scrape(metrics).output, "ringloader_tls_reload_failed") == 1.0);
}

TEST_CASE("a certificate rotation is not held up by a reload indexing a dataset on a hung mount, "
          "and a SIGHUP meanwhile is not lost",
          "[tls]") {
  if (const std::string why = DelayMount::Unavailable(); !why.empty()) RINGLOADER_SKIP(why);
  Pki pki;
  pki.MakeCa("ca", "ringloader test CA");
  pki.Issue("daemon", "ca", "ringloaderd", "DNS:localhost,IP:127.0.0.1", 5);
  pki.Issue("trainer", "ca", "trainer-1", "DNS:trainer-1", 30);
  DaemonFixtureOptions options;
  options.tcp = true;
  options.images = 16;
  options.config_extra = pki.TlsTable("daemon");
  options.ctl_env = pki.ClientEnv("ca", "trainer");
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  INFO(daemon.Log());
  // A new dataset on a mount that answers nothing, and a rotated certificate, in one SIGHUP:
  // the reload waits in the dataset's indexing, the rotation does not wait for it.
  DelayMount mount(daemon.dataset_root(), daemon.dir(), std::chrono::milliseconds(0));
  mount.Stall();
  WriteFile(daemon.config_path(), ReadFile(daemon.config_path()) +
                                      "\n[[datasets]]\nname = \"slow\"\nformat = \"imagefolder\"\n"
                                      "path = \"" + mount.path() + "\"\n");
  pki.Issue("daemon", "ca", "ringloaderd", "DNS:localhost,IP:127.0.0.1", 100);
  const std::string second_serial = pki.SerialOf("daemon");
  daemon.process().Kill(SIGHUP);
  REQUIRE(mount.AwaitHeld(1, std::chrono::seconds(20)));
  CHECK(WaitFor([&] { return ServedSerial(daemon, pki) == second_serial; }, std::chrono::seconds(15)));
  // Another rotation, and its SIGHUP while that reload still waits: not dropped, but applied
  // once the reload is done.
  pki.Issue("daemon", "ca", "ringloaderd", "DNS:localhost,IP:127.0.0.1", 300);
  const std::string third_serial = pki.SerialOf("daemon");
  daemon.process().Kill(SIGHUP);
  REQUIRE(WaitFor(
      [&] { return daemon.Log().find("the config is read again once it is done") != std::string::npos; },
      std::chrono::seconds(10)));
  CHECK(ServedSerial(daemon, pki) == second_serial);  // the second reload has not run yet
  CHECK(Ctl(daemon, options.ctl_env, {"stats"}).exit_code == 0);  // serving all along
  mount.Answer();
  CHECK(WaitFor([&] { return ServedSerial(daemon, pki) == third_serial; }, std::chrono::seconds(20)));
  CHECK(WaitFor([&] { return daemon.Log().find("applied: [tls] certificates, new dataset slow") !=
                             std::string::npos; },
                std::chrono::seconds(10)));
  CHECK_THAT(Ctl(daemon, options.ctl_env, {"stats"}).output,
             Catch::Contains("certificate CN=ringloaderd, 300 days left"));
}

TEST_CASE("a TCP listen without TLS must be asked for, and is warned of at every start", "[tls]") {
  // Without insecure_tcp the daemon does not start, naming the choice.
  DaemonFixtureOptions refused;
  refused.tcp = true;
  refused.server_extra = "insecure_tcp = false";
  DaemonFixture unsafe(refused);
  const CommandResult check =
      RunCommand({DaemonPath(), "--config", unsafe.config_path(), "--check-config"});
  CHECK(check.exit_code != 0);
  CHECK_THAT(check.output, Catch::Contains("is TCP without [tls]"));
  CHECK_THAT(check.output, Catch::Contains("server.insecure_tcp = true"));
  // `--listen HOST:PORT` over a Unix-socket config is held to the same rule.
  DaemonFixture unix_config;
  const CommandResult overridden = RunCommand(
      {DaemonPath(), "--config", unix_config.config_path(), "--listen",
       "127.0.0.1:" + std::to_string(FreeTcpPort())},
      {}, std::chrono::seconds(30));
  CHECK(overridden.exit_code != 0);
  CHECK_THAT(overridden.output, Catch::Contains("is TCP without [tls]"));

  DaemonFixtureOptions options;
  options.tcp = true;  // with insecure_tcp = true
  options.images = 16;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  CHECK_THAT(daemon.Log(), Catch::Contains("is TCP without TLS (server.insecure_tcp = true)"));
  // A client given certificates is told this daemon speaks plaintext.
  Pki pki;
  pki.MakeCa("ca", "ringloader test CA");
  pki.Issue("trainer", "ca", "trainer-1", "DNS:trainer-1", 30);
  const CommandResult mismatch = Ctl(daemon, pki.ClientEnv("ca", "trainer"), {"stats"});
  CHECK(mismatch.exit_code != 0);
  CHECK_THAT(mismatch.output, Catch::Contains("does not speak TLS"));
  // Half a TLS identity is an error naming what is missing.
  const CommandResult half = Ctl(daemon, {{"RINGLOADER_TLS_CA", pki.Pem("ca")}}, {"stats"});
  CHECK(half.exit_code != 0);
  CHECK_THAT(half.output,
             Catch::Contains("RINGLOADER_TLS_CERT and RINGLOADER_TLS_KEY are not set"));
  CHECK_THAT(RunCommand({CtlPath(), "doctor", "--config", daemon.config_path()}).output,
             Catch::Contains("is TCP without TLS"));
}

}  // namespace ringloader::testing
