// SPDX-License-Identifier: Apache-2.0
// server/daemon/config: defaults, every error naming file + key + rule, byte sizes, failpoints.
#include "server/daemon/config.h"

#include <catch2/catch.hpp>

#include <string>

#include "tests/support/test_support.h"

namespace ringloader::server {
namespace {

constexpr char kDataset[] =
    "[[datasets]]\nname = \"train\"\nformat = \"imagefolder\"\npath = \"/data/train\"\n";

absl::StatusOr<DaemonConfig> Parse(const std::string& text) { return ParseConfig(text, "t.toml"); }

// The config with `server` inside [server] and `dataset` appended to one good [[datasets]].
std::string Config(const std::string& server, const std::string& dataset = "") {
  return "[server]\n" + server + "\n" + kDataset + dataset + "\n";
}

void ExpectError(const std::string& text, const std::string& message) {
  absl::StatusOr<DaemonConfig> c = Parse(text);
  INFO(text);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(c.status().message()) == message);
}

// The same, for a message that goes on (the rule's wording, the value got).
void ExpectErrorStarting(const std::string& text, const std::string& start) {
  absl::StatusOr<DaemonConfig> c = Parse(text);
  INFO(text);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(c.status().message()), Catch::StartsWith(start));
}

}  // namespace

TEST_CASE("config: defaults", "[daemon][config]") {
  absl::StatusOr<DaemonConfig> c = Parse(kDataset);
  REQUIRE(c.ok());
  const ServerConfig& s = c->server;
  CHECK(c->source == "t.toml");
  CHECK(s.listen == "unix:/run/ringloader/ringloader.sock");
  CHECK(s.socket_mode == 0660);
  CHECK(s.segment_mode == 0640);
  CHECK(s.state_dir == "/var/lib/ringloader");
  CHECK(s.memory_limit_bytes == 4ull << 30);
  CHECK(s.ring_slots == 0);  // auto: 4, or 3 for batches over 8 MiB
  CHECK(s.max_ring_slots == 32);
  CHECK(s.max_batch_size == 4096);
  CHECK(s.max_image_size == 1024);
  CHECK(s.max_streams == 64);
  CHECK(s.max_streams_per_client == 16);
  CHECK(s.stream_idle_timeout_ms == 30'000);
  CHECK(s.decode_threads == 0);
  REQUIRE(c->datasets.size() == 1);
  const DatasetConfig& d = c->datasets[0];
  CHECK(d.name == "train");
  CHECK(d.path == "/data/train");
  CHECK(d.format == pipeline::DatasetFormat::kImageFolder);
  CHECK(d.on_error == pipeline::OnError::kSkip);
  CHECK(d.max_pixels == 40'000'000);
  CHECK(d.max_file_bytes == 64ull << 20);
  CHECK(d.warnings_are_errors);
  CHECK(d.max_scans == 500);
  CHECK_FALSE(c->failpoints.enabled());
  CHECK(c->FindDataset("train") == &c->datasets[0]);
  CHECK(c->FindDataset("nope") == nullptr);
}

TEST_CASE("config: every key is read", "[daemon][config]") {
  absl::StatusOr<DaemonConfig> c = Parse(Config(
      "listen = \"127.0.0.1:7000\"\nsocket_mode = \"0600\"\nstate_dir = \"/tmp/s\"\n"
      "log_level = \"debug\"\nlog_format = \"timestamped\"\ndecode_threads = 3\n"
      "memory_limit = \"512 MiB\"\nshm_dir = \"/dev/shm\"\nsegment_mode = \"0640\"\n"
      "ring_slots = 6\nmax_ring_slots = 8\nmax_batch_size = 100\nmax_image_size = 300\n"
      "max_streams = 5\nmax_streams_per_client = 2\nstream_idle_timeout_ms = 500\n"
      "max_wait_ms = 50\nwatchdog_ms = 1234\nmetrics_listen = \"127.0.0.1:9464\"\n"
      "insecure_tcp = true",
      "on_error = \"fail\"\ncache = \"memory\"\nmax_pixels = 1000\nmax_file_bytes = \"1MiB\"\n"
      "warnings_are_errors = false\nmax_scans = 7\n"
      "[[datasets]]\nname = \"val\"\nformat = \"manifest\"\npath = \"/v\"\n"
      "manifest = \"/v/m.csv\"\n[failpoints]\naction = \"abort\"\nafter_batches = 9"));
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  const ServerConfig& s = c->server;
  CHECK(s.listen == "127.0.0.1:7000");
  CHECK(s.insecure_tcp);
  CHECK(s.socket_mode == 0600);
  CHECK(s.log_level == "debug");
  CHECK(s.log_format == LogFormat::kTimestamped);
  CHECK(s.decode_threads == 3);
  CHECK(s.memory_limit_bytes == 512ull << 20);
  CHECK(s.segment_mode == 0640);
  CHECK(s.ring_slots == 6);
  CHECK(s.max_ring_slots == 8);
  CHECK(s.max_batch_size == 100);
  CHECK(s.max_image_size == 300);
  CHECK(s.max_streams == 5);
  CHECK(s.max_streams_per_client == 2);
  CHECK(s.stream_idle_timeout_ms == 500);
  CHECK(s.max_wait_ms == 50);
  CHECK(s.watchdog_ms == 1234);
  CHECK(s.metrics_listen == "127.0.0.1:9464");
  REQUIRE(c->datasets.size() == 2);
  CHECK(c->datasets[0].on_error == pipeline::OnError::kFail);
  CHECK(c->datasets[0].max_pixels == 1000);
  CHECK(c->datasets[0].max_file_bytes == 1 << 20);
  CHECK_FALSE(c->datasets[0].warnings_are_errors);
  CHECK(c->datasets[0].max_scans == 7);
  CHECK(c->datasets[0].cache_memory);
  CHECK_FALSE(c->datasets[1].cache_memory);
  CHECK(c->datasets[1].format == pipeline::DatasetFormat::kManifest);
  CHECK(c->datasets[1].manifest == "/v/m.csv");
  CHECK(c->failpoints.action == FailpointConfig::Action::kAbort);
  CHECK(c->failpoints.after_batches == 9);
}

TEST_CASE("config: each error names the file, the key path and the rule", "[daemon][config]") {
  ExpectError(Config("memory_limit = \"lots\""),
              "t.toml: server.memory_limit: must be a size such as \"4GiB\", \"512MiB\" or a byte "
              "count (got \"lots\")");
  ExpectError(Config("memory_limit = 1000"),
              "t.toml: server.memory_limit: must be >= 16777216 bytes (got 1000)");
  ExpectError(Config("memory_limit = -5"), "t.toml: server.memory_limit: must be >= 0 (got -5)");
  ExpectError(Config("memory_limit = true"),
              "t.toml: server.memory_limit: must be a size such as \"4GiB\" (got true)");
  ExpectError(Config("socket_mode = \"999\""),
              "t.toml: server.socket_mode: must be an octal mode such as \"0660\" (got \"999\")");
  ExpectError(Config("socket_mode = 660"),
              "t.toml: server.socket_mode: must be an octal string such as \"0660\" (got 660)");
  ExpectError(Config("log_level = \"loud\""),
              "t.toml: server.log_level: must be one of trace, debug, info, warn, error, "
              "critical, off (got \"loud\")");
  ExpectError(Config("listen = 5"), "t.toml: server.listen: must be a string (got 5)");
  // A sample's read retries run within its deadline (issue 28).
  ExpectError(Config("io_retry_ms = 30000"),
              "t.toml: server.io_retry_ms: must be below decode_deadline_ms (30000): a sample's "
              "reads are retried within its deadline (got 30000)");
  CHECK(Parse(Config("io_retry_ms = 30000\ndecode_deadline_ms = 0")).ok());
  ExpectError(Config("listen = \"\""), "t.toml: server.listen: must not be empty (got \"\")");
  // Ports out of range are errors, not a random port.
  ExpectError(Config("listen = \"127.0.0.1:99999\""),
              "t.toml: server.listen: port must be a number in [1, 65535] "
              "(got \"127.0.0.1:99999\")");
  ExpectError(Config("listen = \"127.0.0.1:0\""),
              "t.toml: server.listen: port must be a number in [1, 65535] "
              "(got \"127.0.0.1:0\")");
  ExpectError(Config("memory_limit = \"512Mb\""),
              "t.toml: server.memory_limit: must be a size such as \"4GiB\", \"512MiB\" or a "
              "byte count (got \"512Mb\")");
  ExpectError(Config("decode_threads = 1.5"),
              "t.toml: server.decode_threads: must be an integer (got 1.500000)");
  ExpectError(Config("ring_slots = 1"),
              "t.toml: server.ring_slots: must be 0 (4, or 3 for batches over 8 MiB) or in "
              "[2, 1024] (got 1)");
  ExpectError(Config("ring_slots = 40"),
              "t.toml: server.ring_slots: must be <= max_ring_slots (32) (got 40)");
  ExpectError(Config("max_batch_size = 0"),
              "t.toml: server.max_batch_size: must be in [1, 1048576] (got 0)");
  ExpectError(Config("max_image_size = 100000"),
              "t.toml: server.max_image_size: must be in [8, 16384] (got 100000)");
  ExpectError(Config("max_streams = 0"), "t.toml: server.max_streams: must be in [1, 4096] (got 0)");
  ExpectError(Config("max_streams_per_client = 0"),
              "t.toml: server.max_streams_per_client: must be in [1, 4096] (got 0)");
  ExpectError(Config("max_streams_per_client = \"many\""),
              "t.toml: server.max_streams_per_client: must be an integer (got \"many\")");
  ExpectError(Config("stream_idle_timeout_ms = 5"),
              "t.toml: server.stream_idle_timeout_ms: must be in [100, 86400000] (got 5)");
  ExpectError(Config("bogus = 1"), "t.toml: server.bogus: unknown key");
  ExpectError(Config("metrics_listen = \"unix:/tmp/m.sock\""),
              "t.toml: server.metrics_listen: must be HOST:PORT (HTTP over TCP) "
              "(got \"unix:/tmp/m.sock\")");
  ExpectError(Config("metrics_listen = \"127.0.0.1:70000\""),
              "t.toml: server.metrics_listen: port must be a number in [1, 65535] "
              "(got \"127.0.0.1:70000\")");
  ExpectError(Config("listen = \"127.0.0.1:9000\"\nmetrics_listen = \"127.0.0.1:9000\""),
              "t.toml: server.metrics_listen: must differ from listen and health_listen "
              "(got \"127.0.0.1:9000\")");
  ExpectError(Config("watchdog_ms = -1"),
              "t.toml: server.watchdog_ms: must be in [0, 86400000] (got -1)");
  ExpectError(std::string(kDataset) + "[oops]\n", "t.toml: oops: unknown key");
  ExpectError("server = 3\n" + std::string(kDataset), "t.toml: server: must be a table [server]");

  ExpectError(Config("", "max_pixels = \"big\""),
              "t.toml: datasets[0].max_pixels: must be an integer (got \"big\")");
  ExpectError(Config("", "max_pixels = 0"),
              "t.toml: datasets[0].max_pixels: must be in [1, 1099511627776] (got 0)");
  ExpectError(Config("", "cache = \"disk\""),
              "t.toml: datasets[0].cache: must be one of none, memory (got \"disk\")");
  ExpectError(Config("", "on_error = \"ignore\""),
              "t.toml: datasets[0].on_error: must be one of skip, fail (got \"ignore\")");
  ExpectError(Config("", "warnings_are_errors = 1"),
              "t.toml: datasets[0].warnings_are_errors: must be true or false (got 1)");
  ExpectError(Config("", "manifest = \"/m.csv\""),
              "t.toml: datasets[0].manifest: is only valid with format = \"manifest\"");
  ExpectError(Config("", "colour = \"red\""), "t.toml: datasets[0].colour: unknown key");
  ExpectError("[[datasets]]\nformat = \"imagefolder\"\npath = \"/d\"\n",
              "t.toml: datasets[0].name: is required");
  ExpectError("[[datasets]]\nname = \"a\"\npath = \"/d\"\n",
              "t.toml: datasets[0].format: is required");
  ExpectError("[[datasets]]\nname = \"a\"\nformat = \"imagefolder\"\npath = \"rel/d\"\n",
              "t.toml: datasets[0].path: must be an absolute path (got \"rel/d\")");
  ExpectError("[[datasets]]\nname = \"a/b\"\nformat = \"imagefolder\"\npath = \"/d\"\n",
              "t.toml: datasets[0].name: may contain only letters, digits, '-', '_' and '.' "
              "(got \"a/b\")");
  ExpectError("[[datasets]]\nname = \"a\"\nformat = \"manifest\"\npath = \"/d\"\n",
              "t.toml: datasets[0].manifest: is required when format = \"manifest\"");
  ExpectError(std::string(kDataset) + kDataset,
              "t.toml: datasets[1].name: \"train\" is already used by another dataset");
  ExpectError("datasets = 1\n", "t.toml: datasets: must be an array of tables [[datasets]]");

  ExpectError(std::string(kDataset) + "[failpoints]\naction = \"explode\"\n",
              "t.toml: failpoints.action: must be one of none, abort, segfault, oom, hang, "
              "hang_decode (got \"explode\")");
  ExpectError(std::string(kDataset) + "[failpoints]\naction = \"segfault\"\n",
              "t.toml: failpoints.action: needs crash_on_path or after_batches to say when");

  // TOML syntax: file, line and column.
  absl::StatusOr<DaemonConfig> broken = Parse("[server\n");
  REQUIRE_FALSE(broken.ok());
  CHECK_THAT(std::string(broken.status().message()), Catch::StartsWith("t.toml:1:"));
}

TEST_CASE("config: a TCP listen needs [tls] or insecure_tcp, and [tls] needs its three files",
          "[daemon][config][tls]") {
  ExpectError(Config("listen = \"0.0.0.0:7000\""),
              "t.toml: server.listen: \"0.0.0.0:7000\" is TCP without [tls]: anyone who reaches "
              "the port could read batches and call the daemon. Add [tls] ca, cert and key "
              "(mutual TLS), or set server.insecure_tcp = true on a network you trust");
  CHECK(Parse(Config("listen = \"0.0.0.0:7000\"\ninsecure_tcp = true")).ok());
  const std::string tls = "[tls]\nca = \"/t/ca.pem\"\ncert = \"/t/c.pem\"\nkey = \"/t/c.key\"\n";
  absl::StatusOr<DaemonConfig> c = Parse(Config("listen = \"0.0.0.0:7000\"") + tls +
                                         "allowed_clients = [\"DNS:trainer-*\", \"IP:10.0.0.5\"]");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->tls.enabled());
  CHECK(c->tls.key == "/t/c.key");
  CHECK(c->tls.allowed_clients == std::vector<std::string>{"DNS:trainer-*", "IP:10.0.0.5"});
  ExpectError(Config("") + "[tls]\nca = \"/t/ca.pem\"\ncert = \"/t/c.pem\"\n",
              "t.toml: tls.key: is required");
  ExpectError(Config("") + "[tls]\nca = \"\"\ncert = \"/t/c.pem\"\nkey = \"/k\"\n",
              "t.toml: tls.ca: must name a PEM file (got \"\")");
  ExpectError(Config("") + tls + "verify = false\n", "t.toml: tls.verify: unknown key");
  ExpectError(Config("") + tls + "allowed_clients = [\"\"]\n",
              "t.toml: tls.allowed_clients: must not hold an empty name (got \"\")");
  ExpectError("tls = 3\n" + Config(""), "t.toml: tls: must be a table [tls]");
  // A feeder's port is TCP, and held to the same rule.
  ExpectError(Config("feeder_listen = \"0.0.0.0:7001\""),
              "t.toml: server.feeder_listen: \"0.0.0.0:7001\" is TCP without [tls]: any host that "
              "reaches the port could have this daemon decode for it. Add [tls] ca, cert and key "
              "(mutual TLS), or set server.insecure_tcp = true on a network you trust");
  CHECK(Parse(Config("feeder_listen = \"0.0.0.0:7001\"") + tls).ok());
  ExpectError(Config("feeder_listen = \"unix:/run/f.sock\"") + tls,
              "t.toml: server.feeder_listen: must be HOST:PORT (other hosts dial it) (got "
              "\"unix:/run/f.sock\")");
  ExpectError(Config("feeder_listen = \"0.0.0.0:7001\"\nmetrics_listen = \"0.0.0.0:7001\"") + tls,
              "t.toml: server.feeder_listen: must differ from listen, health_listen and "
              "metrics_listen (got \"0.0.0.0:7001\")");
  // Its data plane: TLS only, beside a feeder_listen, on a port of its own.
  const std::string fed_here = "feeder_listen = \"0.0.0.0:7001\"\n";
  absl::StatusOr<DaemonConfig> data =
      Parse(Config(fed_here + "feeder_data_listen = \"0.0.0.0:7002\"") + tls);
  REQUIRE(data.ok());
  CHECK(data->server.feeder_data_listen == "0.0.0.0:7002");
  ExpectError(Config(fed_here + "feeder_data_listen = \"0.0.0.0:7002\"\ninsecure_tcp = true"),
              "t.toml: server.feeder_data_listen: \"0.0.0.0:7002\" needs [tls]: the data plane "
              "is mutual TLS only (server.insecure_tcp does not cover it). Add [tls] ca, cert "
              "and key, or leave feeder_data_listen out");
  ExpectError(Config("feeder_data_listen = \"0.0.0.0:7002\"") + tls,
              "t.toml: server.feeder_data_listen: needs server.feeder_listen (hosts learn of the "
              "data port from its answers) (got \"0.0.0.0:7002\")");
  ExpectError(Config(fed_here + "feeder_data_listen = \"0.0.0.0:7001\"") + tls,
              "t.toml: server.feeder_data_listen: must differ from listen, health_listen, "
              "metrics_listen and feeder_listen (got \"0.0.0.0:7001\")");
  CHECK(Parse(Config("feeder_listen = \"10.0.0.5:7001\"\nfeeder_data_listen = \"[::]:7002\"") +
              tls)
            .ok());
  ExpectError(Config(fed_here + "feeder_data_listen = \"127.0.0.1:7002\"") + tls,
              "t.toml: server.feeder_data_listen: must listen where feeder_listen does (on "
              "0.0.0.0, or on every address: \"[::]:PORT\", or \"0.0.0.0:PORT\" beside an IPv4 "
              "feeder_listen): hosts dial the data port at the address they reached "
              "feeder_listen at (got \"127.0.0.1:7002\")");
  // Addresses, not strings: IPv4's every address does not reach an IPv6 feeder_listen's hosts.
  ExpectError(Config("feeder_listen = \"[::]:7001\"\nfeeder_data_listen = \"0.0.0.0:7002\"") + tls,
              "t.toml: server.feeder_data_listen: must listen where feeder_listen does (on ::, "
              "or on every address: \"[::]:PORT\", or \"0.0.0.0:PORT\" beside an IPv4 "
              "feeder_listen): hosts dial the data port at the address they reached "
              "feeder_listen at (got \"0.0.0.0:7002\")");
  CHECK(!Parse(Config("feeder_listen = \"[fd00::5]:7001\"\nfeeder_data_listen = "
                      "\"0.0.0.0:7002\"") +
               tls)
             .ok());
  CHECK(Parse(Config("feeder_listen = \"[::1]:7001\"\nfeeder_data_listen = "
                     "\"[0:0:0:0:0:0:0:1]:7002\"") +
              tls)
            .ok());
  CHECK(Parse(Config("feeder_listen = \"10.0.0.5:7001\"\nfeeder_data_listen = \"0.0.0.0:7002\"") +
              tls)
            .ok());
  CHECK(!Parse(Config("feeder_listen = \"feeder-0.ml:7001\"\nfeeder_data_listen = "
                      "\"10.0.0.5:7002\"") +
               tls)
             .ok());
  CHECK(ListensWhere("::", "10.0.0.5"));
  CHECK(ListensWhere("0.0.0.0", "10.0.0.5"));
  CHECK(ListensWhere("10.0.0.5", "::ffff:10.0.0.5"));
  CHECK(!ListensWhere("0.0.0.0", "::"));
  CHECK(!ListensWhere("10.0.0.6", "10.0.0.5"));
  CHECK(ListensWhere("feeder-0.ml", "feeder-0.ml"));
  CHECK(ListensWhere("::", "feeder-0.ml"));  // a name's hosts reach every address
  CHECK(ListensWhere("0.0.0.0", "feeder-0.ml"));
  CHECK(ListensWhere("::", "fe80::1%eth0"));
  CHECK(!ListensWhere("feeder-0.ml", "10.0.0.5"));
  ExpectError(Config(fed_here + "feeder_data_listen = \"unix:/run/d.sock\"") + tls,
              "t.toml: server.feeder_data_listen: must be HOST:PORT (other hosts dial it) (got "
              "\"unix:/run/d.sock\")");

  // [[feeders]]: dialled over TLS (or insecure_tcp), each a HOST:PORT once.
  const std::string feeder = "[[feeders]]\naddress = \"feeders.ml.svc:7001\"\n";
  absl::StatusOr<DaemonConfig> fed = Parse(Config("local_decode = false\nfeeder_lease_ms = 800") +
                                           tls + feeder + "[[feeders]]\naddress = \"[::1]:7002\"\n");
  REQUIRE(fed.ok());
  REQUIRE(fed->feeders.size() == 2);
  CHECK(fed->feeders[0].address == "feeders.ml.svc:7001");
  CHECK(fed->feeders[1].address == "[::1]:7002");
  CHECK_FALSE(fed->server.local_decode);
  CHECK(fed->server.feeder_lease_ms == 800);
  ExpectError(Config("") + feeder,
              "t.toml: feeders[0].address: \"feeders.ml.svc:7001\" would be dialled without [tls]: "
              "anyone on the path could feed this host's trainers samples of their choosing. Add "
              "[tls] ca, cert and key (mutual TLS), or set server.insecure_tcp = true on a "
              "network you trust");
  CHECK(Parse(Config("insecure_tcp = true") + feeder).ok());
  ExpectError(Config("") + tls + feeder + feeder,
              "t.toml: feeders[1].address: is listed twice (got \"feeders.ml.svc:7001\")");
  ExpectError(Config("") + tls + "[[feeders]]\naddress = \"unix:/f.sock\"\n",
              "t.toml: feeders[0].address: must be HOST:PORT (a feeder_listen) (got "
              "\"unix:/f.sock\")");
  ExpectErrorStarting(Config("") + tls + "[[feeders]]\naddress = \"feeder\"\n",
              "t.toml: feeders[0].address: ");
  ExpectErrorStarting(Config("") + tls + "[[feeders]]\nadress = \"f:1\"\n", "t.toml: feeders[0].");
  ExpectError("feeders = \"f:1\"\n" + Config("") + tls,
              "t.toml: feeders: must be an array of tables [[feeders]]");
  ExpectErrorStarting(Config("feeder_lease_ms = 5") + tls, "t.toml: server.feeder_lease_ms: ");
  ExpectErrorStarting(Config("local_decode = \"no\"") + tls, "t.toml: server.local_decode: ");
  ExpectErrorStarting(Config("") + "[failpoints]\nfeed_lie = \"often\"\n", "t.toml: failpoints.feed_lie: ");
}

TEST_CASE("config: LoadConfig names a missing file, and the shipped config parses",
          "[daemon][config]") {
  absl::StatusOr<DaemonConfig> missing = LoadConfig("/nonexistent/ringloaderd.toml");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()),
             Catch::StartsWith("/nonexistent/ringloaderd.toml: cannot open config file"));

  const std::string shipped = std::string(RINGLOADER_SOURCE_DIR) + "/config/ringloaderd.toml";
  absl::StatusOr<DaemonConfig> c = LoadConfig(shipped);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  // Every documented value equals the built-in default.
  const ServerConfig defaults;
  CHECK(c->server.max_streams == defaults.max_streams);
  CHECK(c->server.max_streams_per_client == defaults.max_streams_per_client);
  CHECK(c->server.max_batch_size == defaults.max_batch_size);
  CHECK(c->server.max_image_size == defaults.max_image_size);
  CHECK(c->server.max_ring_slots == defaults.max_ring_slots);
  CHECK(c->server.ring_slots == defaults.ring_slots);
  CHECK(c->server.stream_idle_timeout_ms == defaults.stream_idle_timeout_ms);

  testing::TempDir dir;
  testing::WriteFile(dir.Join("bad.toml"), Config("max_streams_per_client = -1"));
  absl::StatusOr<DaemonConfig> bad = LoadConfig(dir.Join("bad.toml"));
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) ==
        dir.Join("bad.toml") + ": server.max_streams_per_client: must be in [1, 4096] (got -1)");
}

TEST_CASE("ParseByteSize: units, spaces, and what is refused", "[daemon][config]") {
  CHECK(*ParseByteSize("4GiB") == 4ull << 30);
  CHECK(*ParseByteSize("512 MiB") == 512ull << 20);
  CHECK(*ParseByteSize(" 100MB ") == 100'000'000);
  CHECK(*ParseByteSize("1000") == 1000);
  CHECK(*ParseByteSize("1000B") == 1000);
  CHECK(*ParseByteSize("2KiB") == 2048);
  CHECK(*ParseByteSize("3KB") == 3000);
  CHECK(*ParseByteSize("3kB") == 3000);
  CHECK(*ParseByteSize("1TiB") == 1ull << 40);
  CHECK(*ParseByteSize("0") == 0);
  // Unit spellings are exact: "512Mb" (megabits?), "4gib", "100M" are errors, never a guess.
  for (const char* bad : {"", "GiB", "4 XB", "-1", "1.5GiB", "4GiBs", "99999999999TiB",
                          "99999999999999999999999", "512Mb", "512mb", "4gib", "100M", "2k",
                          "1000b"}) {
    INFO(bad);
    absl::StatusOr<uint64_t> v = ParseByteSize(bad);
    CHECK_FALSE(v.ok());
    if (!v.ok()) CHECK(v.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("ParseFailpointSpec: RINGLOADER_FAILPOINTS text", "[daemon][config]") {
  absl::StatusOr<FailpointConfig> f = ParseFailpointSpec("action=segfault;crash_on_path=class_01/*");
  REQUIRE(f.ok());
  CHECK(f->action == FailpointConfig::Action::kSegfault);
  CHECK(f->crash_on_path == "class_01/*");
  CHECK(f->after_batches == 0);
  CHECK(f->enabled());

  f = ParseFailpointSpec(" after_batches = 3 ; action = abort ; ");
  REQUIRE(f.ok());
  CHECK(f->action == FailpointConfig::Action::kAbort);
  CHECK(f->after_batches == 3);

  f = ParseFailpointSpec("action=oom;crash_on_path=a=b");  // '=' inside a value
  REQUIRE(f.ok());
  CHECK(f->action == FailpointConfig::Action::kOom);
  CHECK(f->crash_on_path == "a=b");

  f = ParseFailpointSpec("");
  REQUIRE(f.ok());
  CHECK_FALSE(f->enabled());

  auto error = [](const std::string& spec) {
    absl::StatusOr<FailpointConfig> r = ParseFailpointSpec(spec);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  CHECK(error("action=explode") ==
        "RINGLOADER_FAILPOINTS: action: must be abort, segfault, oom, hang, hang_decode or none "
        "(got \"explode\")");
  CHECK(error("after_batches=x") ==
        "RINGLOADER_FAILPOINTS: after_batches: must be an integer (got \"x\")");
  CHECK(error("when=now") == "RINGLOADER_FAILPOINTS: unknown key \"when\"");
}

}  // namespace ringloader::server

namespace ringloader::server {
namespace {

TEST_CASE("11: webdataset, tfrecord and arrays keys are read, and refused for other formats",
          "[daemon][config]") {
  absl::StatusOr<DaemonConfig> c = Parse(
      "[[datasets]]\nname = \"w\"\nformat = \"webdataset\"\npath = \"/d/s-{0..9}.tar\"\n"
      "image_key = \"jpg;jpeg\"\nlabel_key = \"json:label\"\nragged = [\"boxes\"]\n"
      "[[datasets]]\nname = \"t\"\nformat = \"tfrecord\"\npath = \"/d/*.tfrecord\"\n"
      "image_feature = \"jpeg\"\nlabel_feature = \"\"\nlabel_offset = -1\n"
      "[[datasets]]\nname = \"a\"\nformat = \"arrays\"\npath = \"/d/arrays\"\nlabel = \"y\"\n");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  const DatasetConfig& w = c->datasets[0];
  CHECK(w.format == pipeline::DatasetFormat::kWebDataset);
  CHECK(w.image_key == std::vector<std::string>{"jpg", "jpeg"});
  CHECK(w.label_key == "json:label");
  CHECK(w.ragged == std::vector<std::string>{"boxes"});
  const DatasetConfig& t = c->datasets[1];
  CHECK(t.format == pipeline::DatasetFormat::kTfRecord);
  CHECK(t.image_feature == "jpeg");
  CHECK(t.label_feature.empty());
  CHECK(t.label_offset == -1);
  CHECK(c->datasets[2].format == pipeline::DatasetFormat::kArrays);
  CHECK(c->datasets[2].label == "y");
  const pipeline::DatasetSpec spec = DatasetSpecOf(w, "/state");
  CHECK(spec.image_keys == w.image_key);
  CHECK(spec.state_dir == "/state");

  const std::string head = "[[datasets]]\nname = \"x\"\npath = \"/d\"\n";
  ExpectError(head + "format = \"imagefolder\"\nimage_key = \"jpg\"\n",
              "t.toml: datasets[0].image_key: is only valid with format = \"webdataset\"");
  ExpectError(head + "format = \"webdataset\"\nlabel_offset = 1\n",
              "t.toml: datasets[0].label_offset: is only valid with format = \"tfrecord\"");
  ExpectError(head + "format = \"tfrecord\"\nlabel = \"y\"\n",
              "t.toml: datasets[0].label: is only valid with format = \"arrays\"");
  ExpectError(head + "format = \"webdataset\"\nimage_key = \";\"\n",
              "t.toml: datasets[0].image_key: must name at least one extension (got \"\")");
  absl::StatusOr<DaemonConfig> numbers = Parse(head + "format = \"webdataset\"\nragged = [1]\n");
  REQUIRE_FALSE(numbers.ok());
  CHECK_THAT(std::string(numbers.status().message()),
             Catch::StartsWith("t.toml: datasets[0].ragged: must be a list of strings"));
  ExpectError(head + "format = \"parquet\"\n",
              "t.toml: datasets[0].format: must be one of imagefolder, manifest, webdataset, "
              "tfrecord, arrays (got \"parquet\")");
}

}  // namespace
}  // namespace ringloader::server
