// SPDX-License-Identifier: Apache-2.0
// Issue 40 item 4: feeders' faults through the real binaries. A trainer reading through a host
// that draws from feeders gets every sample exactly once, with the same bytes as a host alone,
// while feeders come and go (by process, and by their name's addresses), the host is SIGKILLed
// with leases out, a feeder sits in another network namespace behind a veth that is cut, the
// link loses and delays packets (tc netem, or tests/support/netem_queue where the kernel has no
// netem), and one of a feeder's two hosts is SIGSTOPped while answers are sent to it.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "client/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/scrape.h"
#include "tests/integration/storage_data.h"
#include "tests/support/test_pki.h"
#include "tests/support/test_support.h"

namespace ringloader::testing {
namespace {

constexpr uint32_t kImages = 96;

// A feeder of dataset "shared" (the files at `data`) on `address`, certificate `cert`.
std::unique_ptr<DaemonFixture> MakeFeeder(const TestPki& pki, const std::string& cert,
                                          const std::string& data, const std::string& address,
                                          std::vector<std::string> command_prefix = {},
                                          const std::string& extra = "") {
  DaemonFixtureOptions options;
  options.images = 4;
  // Its data plane too (feed_socket.h): the faults below reach the answers that come there.
  options.server_extra = "feeder_listen = \"" + address + "\"\nfeeder_data_listen = \"" +
                         address.substr(0, address.rfind(':')) + ":" +
                         std::to_string(FreeTcpPort()) + "\"";
  options.config_extra = DatasetTable("shared", data) +
                         pki.TlsTable(cert, "allowed_clients = [\"DNS:host-*\"]\n") + extra;
  options.command_prefix = std::move(command_prefix);
  return std::make_unique<DaemonFixture>(options);
}

// A host of dataset "shared" drawing from `feeders` only (local_decode = false), supervised
// unless `supervise` is false; its client certificate `cert`.
std::unique_ptr<DaemonFixture> MakeHost(const TestPki& pki, const std::string& data,
                                        const std::vector<std::string>& feeders,
                                        int lease_ms = 1500, const std::string& cert = "host",
                                        bool supervise = true,
                                        std::vector<std::string> command_prefix = {}) {
  DaemonFixtureOptions options;
  options.images = 4;
  options.supervise = supervise;
  options.command_prefix = std::move(command_prefix);
  options.server_extra = "local_decode = false\nfeeder_lease_ms = " + std::to_string(lease_ms);
  options.config_extra = DatasetTable("shared", data) + pki.TlsTable(cert);
  for (const std::string& f : feeders) {
    options.config_extra += "[[feeders]]\naddress = \"" + f + "\"\n";
  }
  return std::make_unique<DaemonFixture>(options);
}

// What a host alone delivers: two epochs of "shared" read from a plain daemon (or `stream`).
std::vector<std::string> Alone(const std::string& data,
                               const client::StreamOptions& stream = Options("shared", 2)) {
  DaemonFixtureOptions options;
  options.images = 4;
  options.config_extra = DatasetTable("shared", data);
  DaemonFixture alone(options);
  REQUIRE(alone.Start());
  client::Client c(alone.endpoint());
  return Lines(*c.Open(stream));
}

uint64_t FeederSamples(const v1::GetStatsResponse& stats) {
  uint64_t n = 0;
  for (const v1::FeederStatus& f : stats.feeders()) n += f.samples();
  return n;
}

// A network namespace joined to this one by a veth pair: outer_ip here, inner_ip there.
class NetNs {
 public:
  NetNs() {
    const int id = static_cast<int>(::getpid() % 200) + 20;
    name_ = "rl-feeder-" + std::to_string(::getpid());
    outer_ = "rlf" + std::to_string(id) + "a";
    inner_ = "rlf" + std::to_string(id) + "b";
    outer_ip_ = "10.231." + std::to_string(id) + ".1";
    inner_ip_ = "10.231." + std::to_string(id) + ".2";
    for (const std::vector<std::string>& step : std::vector<std::vector<std::string>>{
             {"netns", "add", name_},
             {"netns", "exec", name_, kIp, "link", "set", "lo", "up"},
             {"link", "add", outer_, "type", "veth", "peer", "name", inner_},
             {"link", "set", inner_, "netns", name_},
             {"addr", "add", outer_ip_ + "/30", "dev", outer_},
             {"link", "set", outer_, "up"},
             {"netns", "exec", name_, kIp, "addr", "add", inner_ip_ + "/30", "dev", inner_},
             {"netns", "exec", name_, kIp, "link", "set", inner_, "up"}}) {
      std::vector<std::string> argv = {kIp};
      argv.insert(argv.end(), step.begin(), step.end());
      const CommandResult r = RunCommand(argv);
      if (r.exit_code != 0) {
        why_ = "ip " + step[0] + " " + step[1] + ": " + r.output;
        return;
      }
    }
  }
  ~NetNs() {
    (void)RunCommand({kIp, "link", "del", outer_});
    (void)RunCommand({kIp, "netns", "del", name_});
  }
  // Empty when the namespace and its link are up.
  const std::string& why_not() const { return why_; }
  const std::string& inner_ip() const { return inner_ip_; }
  const std::string& outer_ip() const { return outer_ip_; }
  std::vector<std::string> Exec() const { return {kIp, "netns", "exec", name_}; }
  void Link(bool up) {
    REQUIRE(RunCommand({kIp, "link", "set", outer_, up ? "up" : "down"}).exit_code == 0);
  }
  // Every packet between the namespaces delayed `delay_ms` and `loss_percent` of them lost, each
  // way: `tc qdisc netem` on both ends, or where the kernel has no sch_netem, netem_queue
  // (tests/support) holding the namespace's packets from an iptables NFQUEUE rule. Returns which
  // one, or why neither can be had here (empty `how`).
  struct Impairment {
    std::string how, why_not;
  };
  Impairment Impair(int delay_ms, int loss_percent) {
    const std::vector<std::string> netem = {"netem", "delay", std::to_string(delay_ms) + "ms",
                                            "loss", std::to_string(loss_percent) + "%"};
    std::vector<std::string> outer = {kTc, "qdisc", "replace", "dev", outer_, "root"};
    std::vector<std::string> inner = {kIp, "netns", "exec", name_, kTc, "qdisc", "replace",
                                      "dev", inner_, "root"};
    outer.insert(outer.end(), netem.begin(), netem.end());
    inner.insert(inner.end(), netem.begin(), netem.end());
    const CommandResult with_netem = RunCommand(outer);
    if (with_netem.exit_code == 0) {
      const CommandResult r = RunCommand(inner);
      if (r.exit_code != 0) return {"", "tc netem in the namespace: " + r.output};
      return {"tc netem", ""};
    }
    const std::string queue_binary = BuiltBinary("netem_queue");
    if (::access(queue_binary.c_str(), X_OK) != 0 || ::access(kIptables, X_OK) != 0) {
      return {"", "no tc netem (" + with_netem.output + ") and no netem_queue or " + kIptables};
    }
    const std::string ready = dir_.Join("netem_queue.out");
    std::vector<std::string> argv = Exec();
    argv.insert(argv.end(), {queue_binary, "--queue", "7", "--delay-ms", std::to_string(delay_ms),
                             "--loss-percent", std::to_string(loss_percent), "--seed", "40"});
    queue_ = std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{}, ready);
    if (!WaitFor([&] { return ReadFile(ready).find("ready") != std::string::npos ||
                              !queue_->Running(); },
                 std::chrono::seconds(10)) ||
        !queue_->Running()) {
      return {"", "netem_queue did not start: " + ReadFile(ready)};
    }
    // Only once the queue is held: a packet sent to a queue no one holds is dropped.
    for (const std::vector<std::string>& rule : std::vector<std::vector<std::string>>{
             {"INPUT", "-i", inner_}, {"OUTPUT", "-o", inner_}}) {
      std::vector<std::string> add = Exec();
      add.insert(add.end(), {kIptables, "-A"});
      add.insert(add.end(), rule.begin(), rule.end());
      add.insert(add.end(), {"-j", "NFQUEUE", "--queue-num", "7"});
      const CommandResult r = RunCommand(add);
      if (r.exit_code != 0) return {"", "iptables NFQUEUE rule: " + r.output};
    }
    return {"netem_queue (NFQUEUE: this kernel has no sch_netem: " + with_netem.output + ")", ""};
  }
  // The delay line still holds its queue (true when tc netem does the work).
  bool ImpairmentAlive() { return queue_ == nullptr || queue_->Running(); }

 private:
  static constexpr const char* kIp = "/usr/sbin/ip";
  static constexpr const char* kTc = "/usr/sbin/tc";
  static constexpr const char* kIptables = "/usr/sbin/iptables";
  std::string name_, outer_, inner_, outer_ip_, inner_ip_, why_;
  TempDir dir_;
  std::unique_ptr<Subprocess> queue_;  // netem_queue, where tc netem is not to be had
};

// A feeder in `ns` (its certificate for the namespace's address) and a host here drawing from
// it alone, over a generated dataset; `reference`: what a host alone delivers.
// `lease_ms`: the host's feeder_lease_ms; `listen`: the feeder's feeder_listen (empty: the
// address the host dials, the namespace's on port 7001).
struct ThroughNetns {
  explicit ThroughNetns(const NetNs& ns, int lease_ms = 1500, const std::string& listen = "") {
    WriteDataset(data.Join("images"), kImages);
    pki.MakeCa("ca", "ringloader test CA");
    pki.Issue("feeder", "ca", "feeder", "IP:" + ns.inner_ip(), 30);
    pki.Issue("host", "ca", "host-1", "DNS:host-1", 30);
    reference = Alone(data.Join("images"));
    const std::string address = ns.inner_ip() + ":7001";
    feeder = MakeFeeder(pki, "feeder", data.Join("images"), listen.empty() ? address : listen,
                        ns.Exec());
    if (!feeder->Start()) FAIL(feeder->Log());
    host = MakeHost(pki, data.Join("images"), {address}, lease_ms);
    if (!host->Start()) FAIL(host->Log());
  }
  TempDir data;
  TestPki pki;
  std::vector<std::string> reference;
  std::unique_ptr<DaemonFixture> feeder, host;
};

}  // namespace

TEST_CASE("40.4: the host SIGKILLed with leases out and three feeders coming and going during "
          "the epochs: every sample once, the same bytes as a host alone",
          "[feeder][faults]") {
  TempDir data;
  WriteDataset(data.Join("images"), kImages);
  TestPki pki;
  pki.MakeCa("ca", "ringloader test CA");
  pki.Issue("feeder", "ca", "feeder", "IP:127.0.0.1", 30);
  pki.Issue("host", "ca", "host-1", "DNS:host-1", 30);
  const std::vector<std::string> reference = Alone(data.Join("images"));
  REQUIRE(reference.size() == 2 * kImages);

  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<DaemonFixture>> feeders;
  for (int i = 0; i < 3; ++i) {
    addresses.push_back("127.0.0.1:" + std::to_string(FreeTcpPort()));
    feeders.push_back(MakeFeeder(pki, "feeder", data.Join("images"), addresses.back()));
    REQUIRE(feeders.back()->Start());
  }
  auto host = MakeHost(pki, data.Join("images"), addresses);
  if (!host->Start()) FAIL(host->Log());
  client::Client c(host->endpoint());
  auto stream = c.Open(Options("shared", 2));
  int batches = 0, kills = 0, comings = 0, goings = 0;
  const std::vector<std::string> got = Lines(*stream, [&] {
    ++batches;
    // Every 3rd batch a feeder goes (SIGKILL) and the one gone longest comes back.
    if (batches % 3 == 0) {
      const size_t going = static_cast<size_t>(batches / 3) % feeders.size();
      const size_t coming = (going + 1) % feeders.size();
      if (!feeders[coming]->process().Running()) {
        REQUIRE(feeders[coming]->Start());
        ++comings;
      }
      feeders[going]->process().Kill(SIGKILL);
      feeders[going]->process().Wait();
      ++goings;
    }
    // Every 5th batch the host is SIGKILLed (its supervisor restarts it): whatever it had
    // leased is lost with it, and the trainer resumes at the next batch.
    if (batches % 5 == 0 && kills < 3) {
      const pid_t serving = host->ServingPid();
      REQUIRE(serving > 0);
      REQUIRE(::kill(serving, SIGKILL) == 0);
      ++kills;
      WaitFor([&] { return host->ServingPid() > 0 && host->ServingPid() != serving; },
              std::chrono::seconds(30));
    }
  });
  INFO(host->Log());
  CHECK(kills == 3);
  CHECK(goings >= 5);
  CHECK(comings >= 3);
  CHECK(stream->reconnects() >= 3);
  CHECK(got == reference);
  CHECK(FeederSamples(Stats(host->endpoint())) > 0);
}

TEST_CASE("40.4: a feeder name whose addresses come and go (a headless Service's pods): a new "
          "address is drawn from, a gone one forgotten, a refusal asked again later, and the same "
          "bytes throughout",
          "[feeder][faults]") {
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to give the host a hosts file of its own");
  TempDir dir;
  WriteDataset(dir.Join("images"), kImages);
  WriteDataset(dir.Join("other"), kImages / 2);  // a feeder whose files are not the host's
  TestPki pki;
  pki.MakeCa("ca", "ringloader test CA");
  pki.Issue("feeder", "ca", "feeder", "DNS:feeders.test", 30);
  pki.Issue("host", "ca", "host-1", "DNS:host-1", 30);
  const std::vector<std::string> reference = Alone(dir.Join("images"));
  // The name's addresses, as a cluster's DNS answers for a headless Service: one line each.
  const std::string hosts = dir.Join("hosts");
  const auto publish = [&](const std::vector<std::string>& ips) {
    std::string lines = "127.0.0.1 localhost\n";
    for (const std::string& ip : ips) lines += ip + " feeders.test\n";
    WriteFile(hosts, lines);  // in place: the host's bind mount sees the same file
  };
  publish({"127.0.0.2", "127.0.0.3"});
  const std::string port = std::to_string(FreeTcpPort());
  std::map<std::string, std::unique_ptr<DaemonFixture>> pods;
  for (const std::string ip : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
    pods[ip] = MakeFeeder(pki, "feeder", dir.Join("images"), ip + ":" + port);
    REQUIRE(pods[ip]->Start());
  }
  pods["127.0.0.5"] = MakeFeeder(pki, "feeder", dir.Join("other"), "127.0.0.5:" + port);
  REQUIRE(pods["127.0.0.5"]->Start());

  DaemonFixtureOptions options;
  options.images = 4;
  const std::string metrics = "127.0.0.1:" + std::to_string(FreeTcpPort());
  options.server_extra =
      "local_decode = false\nfeeder_lease_ms = 1500\nmetrics_listen = \"" + metrics + "\"";
  options.config_extra = DatasetTable("shared", dir.Join("images")) + pki.TlsTable("host") +
                         "[[feeders]]\naddress = \"feeders.test:" + port + "\"\n" +
                         "[failpoints]\nfeeder_resolve_ms = 200\n";
  // A mount namespace of its own, where /etc/hosts is `hosts`.
  options.command_prefix = {"/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
                            "mount --bind \"$0\" /etc/hosts && exec \"$@\"", hosts};
  DaemonFixture host(options);
  if (!host.Start()) FAIL(host.Log());
  INFO(host.Log());
  // The host's feeders now: address -> its FeederStatus.
  const auto feeders = [&] {
    std::map<std::string, v1::FeederStatus> by_address;
    const v1::GetStatsResponse stats = Stats(host.endpoint());
    for (const v1::FeederStatus& f : stats.feeders()) by_address[f.address()] = f;
    return by_address;
  };
  const auto read_all = [&] {
    client::Client c(host.endpoint());
    return Lines(*c.Open(Options("shared", 2)));
  };
  const std::string a = "127.0.0.2:" + port, b = "127.0.0.3:" + port, c = "127.0.0.4:" + port,
                    other = "127.0.0.5:" + port;
  REQUIRE(WaitFor([&] { return feeders().size() == 2; }, std::chrono::seconds(10)));
  CHECK(read_all() == reference);
  CHECK(feeders()[a].samples() + feeders()[b].samples() > 0);

  // a's pod goes, c's comes: c is drawn from, a is "gone" then forgotten (10 periods, 2 s).
  publish({"127.0.0.3", "127.0.0.4"});
  REQUIRE(WaitFor([&] { return feeders().count(c) == 1; }, std::chrono::seconds(10)));
  CHECK(read_all() == reference);
  CHECK(feeders()[c].samples() > 0);
  REQUIRE(WaitFor([&] { return feeders().count(a) == 0; }, std::chrono::seconds(20)));
  CHECK(feeders().size() == 2);
  CHECK_THAT(host.Log(), Catch::Contains(a + " forgotten"));
  const CommandResult scraped = Scrape(metrics);
  CHECK_THAT(scraped.output, !Catch::Contains("feeder=\"" + a) &&
                                 Catch::Contains("feeder=\"" + c));

  // Only the pod with other files: refused, then asked again 20 periods (4 s) later.
  publish({"127.0.0.5"});
  REQUIRE(WaitFor([&] { return feeders().count(other) == 1; }, std::chrono::seconds(10)));
  CHECK(read_all() == reference);
  v1::FeederStatus refusing = feeders()[other];
  CHECK(refusing.refused_datasets_size() == 1);
  CHECK(refusing.samples() == 0);
  const uint64_t refusals = refusing.lease_failures();
  CHECK(refusals >= 1);
  REQUIRE(WaitFor([&] { return feeders()[other].refused_datasets_size() == 0; },
                  std::chrono::seconds(20)));
  CHECK(read_all() == reference);
  refusing = feeders()[other];
  CHECK(refusing.lease_failures() > refusals);  // asked again, and refused again
  CHECK(refusing.refused_datasets_size() == 1);
}

TEST_CASE("40.4: a feeder in another network namespace behind a veth: the same bytes, with the "
          "link cut mid-epoch and restored",
          "[feeder][faults][netns]") {
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to make a network namespace");
  NetNs ns;
  if (!ns.why_not().empty()) RINGLOADER_SKIP("no network namespace here: " + ns.why_not());
  ThroughNetns rig(ns);
  const std::vector<std::string>& reference = rig.reference;
  DaemonFixture* host = rig.host.get();
  INFO(host->Log());
  client::Client c(host->endpoint());
  int batches = 0;
  uint64_t before_cut = 0;
  const std::vector<std::string> got = Lines(*c.Open(Options("shared", 2)), [&] {
    ++batches;
    if (batches == 4) {
      before_cut = FeederSamples(Stats(host->endpoint()));
      ns.Link(false);
    }
    if (batches == 10) ns.Link(true);
  });
  CHECK(got == reference);
  const v1::GetStatsResponse stats = Stats(host->endpoint());
  REQUIRE(stats.feeders_size() == 1);
  CHECK(before_cut > 0);
  CHECK(stats.feeders(0).lease_failures() >= 1);
  CHECK(stats.feeder_fallback_samples() > 0);
}

TEST_CASE("40.2: a feeder listening on [::] where net.ipv6.bindv6only = 1 takes IPv4 hosts on "
          "both its ports (its data plane clears IPV6_V6ONLY, as gRPC's port does)",
          "[feeder][netns]") {
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to make a network namespace");
  NetNs ns;
  if (!ns.why_not().empty()) RINGLOADER_SKIP("no network namespace here: " + ns.why_not());
  // bindv6only is the namespace's own: this one's is set, the host's is left as it is.
  std::vector<std::string> set_sysctl = ns.Exec();
  set_sysctl.insert(set_sysctl.end(), {"/bin/sh", "-c",
                                       "echo 1 > /proc/sys/net/ipv6/bindv6only && "
                                       "cat /proc/sys/net/ipv6/bindv6only"});
  const CommandResult sysctl = RunCommand(set_sysctl);
  if (sysctl.exit_code != 0) RINGLOADER_SKIP("no IPv6 in the namespace: " + sysctl.output);
  REQUIRE(sysctl.output == "1\n");
  // Both ports on [::]; the host dials the namespace's IPv4 address.
  ThroughNetns rig(ns, /*lease_ms=*/1500, "[::]:7001");
  INFO(rig.feeder->Log());
  CHECK_THAT(rig.feeder->Log(), Catch::Contains("feeding other hosts' data plane on [::]:"));
  INFO(rig.host->Log());
  client::Client c(rig.host->endpoint());
  CHECK(Lines(*c.Open(Options("shared", 2))) == rig.reference);
  const v1::GetStatsResponse stats = Stats(rig.host->endpoint());
  REQUIRE(stats.feeders_size() == 1);
  CHECK(stats.feeders(0).samples() == 2 * kImages);
  // Its answers came over the data plane, not gRPC's fallback: the IPv4 dial to [::] was taken.
  CHECK(stats.feeders(0).transport() == "tls socket");
  CHECK(stats.feeder_fallback_samples() == 0);
}

// Bytes the feeder has queued and not had taken (Send-Q) on its connections from `peer_ip` to
// its port `port`, the most on one; -1 when ss cannot say.
int64_t QueuedTo(const std::string& peer_ip, int port) {
  const CommandResult r = RunCommand(
      {"/usr/bin/ss", "-tnH", "state", "established", "( sport = :" + std::to_string(port) + " )"});
  if (r.exit_code != 0) return -1;
  int64_t most = 0;
  std::istringstream lines(r.output);
  std::string line;
  while (std::getline(lines, line)) {  // Recv-Q Send-Q Local:Port Peer:Port
    std::istringstream fields(line);
    int64_t recv_q = 0, send_q = 0;
    std::string local, peer;
    // (gRPC's port, dual-stack, names an IPv4 peer v4-mapped.)
    if (fields >> recv_q >> send_q >> local >> peer &&
        (peer.rfind(peer_ip + ":", 0) == 0 || peer.rfind("[::ffff:" + peer_ip + "]:", 0) == 0)) {
      most = std::max(most, send_q);
    }
  }
  return most;
}

TEST_CASE("40.4: a host SIGSTOPped while a feeder sends it answers (the feeder's writes to it "
          "blocked): the feeder serves its other host meanwhile, and both get a host alone's "
          "bytes",
          "[feeder][faults][netns]") {
  // A host that stops reading must cost the feeder only that host's calls: its fill turn, its
  // memory share and its connections, never the other hosts' answers. Two hosts at different
  // addresses (a feeder counts its limits per address): one in a network namespace.
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to make a network namespace");
  NetNs ns;
  if (!ns.why_not().empty()) RINGLOADER_SKIP("no network namespace here: " + ns.why_not());
  TempDir data;
  WriteDataset(data.Join("images"), kImages);
  TestPki pki;
  pki.MakeCa("ca", "ringloader test CA");
  pki.Issue("feeder", "ca", "feeder", "IP:127.0.0.1,IP:" + ns.outer_ip(), 30);
  pki.Issue("host", "ca", "host-1", "DNS:host-1", 30);
  pki.Issue("host2", "ca", "host-2", "DNS:host-2", 30);
  // Answers larger than the sockets' buffers hold (batches of 48 at 224 px: 7.2 MB a round),
  // each 3 s late (failpoint "slow": after its fill, before its first byte).
  client::StreamOptions big = Options("shared", 2);
  big.batch_size = kImages / 2;
  big.image_size = 224;
  client::StreamOptions one = big;
  one.end_epoch = 1;
  const std::vector<std::string> reference = Alone(data.Join("images"), big);
  const std::vector<std::string> reference_one = Alone(data.Join("images"), one);
  REQUIRE(reference.size() == 2 * kImages);

  const std::string port = std::to_string(FreeTcpPort());
  auto feeder = MakeFeeder(pki, "feeder", data.Join("images"), "0.0.0.0:" + port, {},
                           "[failpoints]\nfeed_lie = \"slow\"\n");
  if (!feeder->Start()) FAIL(feeder->Log());
  // (Not std::regex: GCC 12 warns inside <regex> at the sanitizer build's -O1.)
  const std::string feeder_log = feeder->Log();
  const std::string said = "data plane on 0.0.0.0:";
  const size_t at = feeder_log.find(said);
  REQUIRE(at != std::string::npos);
  const int data_port = std::atoi(feeder_log.c_str() + at + said.size());
  REQUIRE(data_port > 0);
  // Leases of 20 s: every answer comes (3 s late), none is given up for being slow. The
  // stopped host: in the namespace, not supervised (the signal reaches the daemon itself).
  auto stopped = MakeHost(pki, data.Join("images"), {ns.outer_ip() + ":" + port}, 20'000, "host",
                          /*supervise=*/false, ns.Exec());
  if (!stopped->Start()) FAIL(stopped->Log());
  auto other = MakeHost(pki, data.Join("images"), {"127.0.0.1:" + port}, 20'000, "host2");
  if (!other->Start()) FAIL(other->Log());
  INFO(feeder->Log());

  client::Client c(stopped->endpoint());
  const uint64_t decoded_before = Stats(feeder->endpoint()).samples_decoded();
  auto stream = c.Open(big);  // not read yet
  // Stopped once the feeder has filled its first call (its first round's; the next round's is
  // leased ahead): each answer leaves 3 s after its fill, far more than the stats call and the
  // signal take, so both answers come to a stopped host.
  const auto filled = [&] {
    return Stats(feeder->endpoint()).samples_decoded() >= decoded_before + big.batch_size;
  };
  REQUIRE(WaitFor(filled, std::chrono::seconds(60)));
  stopped->process().Kill(SIGSTOP);
  // Its answers come (the first went over gRPC, the rest over the data plane) and stay queued.
  int64_t queued = -1;
  WaitFor(
      [&] {
        queued = std::max(QueuedTo(ns.inner_ip(), data_port),
                          QueuedTo(ns.inner_ip(), std::stoi(port)));
        return queued > (64 << 10);
      },
      std::chrono::seconds(20));
  client::Client c2(other->endpoint());
  const std::vector<std::string> other_got = Lines(*c2.Open(one));
  stopped->process().Kill(SIGCONT);
  const std::vector<std::string> got = Lines(*stream);
  INFO(stopped->Log());
  INFO(other->Log());
  // The feeder's answer to the stopped host was blocked mid-send: bytes it could not send (its
  // send queue; the stopped host's receive window shut), of a 7.2 MB answer.
  CHECK(queued > (64 << 10));
  CHECK(other_got == reference_one);
  const v1::GetStatsResponse other_stats = Stats(other->endpoint());
  CHECK(FeederSamples(other_stats) == kImages);  // all from the feeder, none fell back
  CHECK(other_stats.feeder_fallback_samples() == 0);
  CHECK(got == reference);  // and the stopped host, woken, delivers exactly too
}

TEST_CASE("40.4: 10% packet loss and 50 ms delay each way between the host and its feeder (tc "
          "netem, or an NFQUEUE delay line where the kernel has none): the same bytes",
          "[feeder][faults][netns]") {
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to make a network namespace");
  NetNs ns;
  if (!ns.why_not().empty()) RINGLOADER_SKIP("no network namespace here: " + ns.why_not());
  const NetNs::Impairment impairment = ns.Impair(50, 10);
  if (impairment.how.empty()) RINGLOADER_SKIP("no way to lose and delay packets here: " +
                                              impairment.why_not);
  WARN("packets lost and delayed by " + impairment.how);
  // A lease long enough for a connection whose handshake lost packets (each resent after a
  // second or more): with 1.5 s, the first call often ran out, the feeder was paused and the
  // short run ended without it (as few as 24 of 192 samples from it, sometimes none).
  ThroughNetns rig(ns, /*lease_ms=*/6000);
  const std::vector<std::string>& reference = rig.reference;
  DaemonFixture* host = rig.host.get();
  INFO(host->Log());
  client::Client c(host->endpoint());
  CHECK(Lines(*c.Open(Options("shared", 2))) == reference);
  CHECK(FeederSamples(Stats(host->endpoint())) > 0);
  CHECK(ns.ImpairmentAlive());
}

}  // namespace ringloader::testing
