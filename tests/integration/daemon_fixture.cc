// SPDX-License-Identifier: Apache-2.0
#include "tests/integration/daemon_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "client/channel.h"
#include "proto/ringloader.grpc.pb.h"
#include "server/image/synthetic.h"

namespace ringloader::testing {

int OpenIdleTcp(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  if (!bytes.empty()) (void)!::write(fd, bytes.data(), bytes.size());
  return fd;
}

int FreeTcpPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("fixture: free port");
    std::abort();
  }
  close(fd);
  return ntohs(addr.sin_port);
}

std::string CtlPath() { return BuiltBinary("client/ctl/ringloaderctl"); }
std::string DaemonPath() { return BuiltBinary("server/ringloaderd"); }

DaemonFixture::DaemonFixture(DaemonFixtureOptions options) : options_(std::move(options)) {
  endpoint_ = options_.tcp ? "127.0.0.1:" + std::to_string(FreeTcpPort())
                           : "unix:" + dir_.Join("rl.sock");
  image::SyntheticDatasetOptions ds;
  ds.out_dir = dataset_root();
  ds.count = options_.images;
  ds.classes = options_.classes;
  ds.seed = options_.dataset_seed;
  auto written = image::WriteSyntheticDataset(ds);
  if (!written.ok()) {
    std::fprintf(stderr, "fixture: %s\n", written.status().ToString().c_str());
    std::abort();
  }
  std::ostringstream toml;
  toml << "[server]\n"
       << "listen = \"" << endpoint_ << "\"\n"
       << "state_dir = \"" << state_dir() << "\"\n"
       << "decode_threads = " << options_.decode_threads << "\n"
       << "memory_limit = \"" << options_.memory_limit << "\"\n"
       << "log_level = \"info\"\n"
       << "log_format = \"timestamped\"\n"
       << options_.server_extra << "\n"
       << (options_.tcp && options_.config_extra.find("[tls]") == std::string::npos &&
                   options_.server_extra.find("insecure_tcp") == std::string::npos
               ? "insecure_tcp = true\n"
               : "")
       << "[[datasets]]\n"
       << "name = \"synth\"\n"
       << "format = \"imagefolder\"\n"
       << "path = \"" << dataset_root() << "\"\n"
       << "on_error = \"" << options_.on_error << "\"\n"
       << "max_pixels = 20000000\n"
       << "max_file_bytes = \"16MiB\"\n"
       << options_.config_extra << "\n";
  WriteFile(config_path(), toml.str());
}

DaemonFixture::~DaemonFixture() {
  if (process_ && process_->Running()) {
    process_->Kill(SIGTERM);
    if (process_->Wait(std::chrono::seconds(10)) == -1) process_->Kill(SIGKILL);
  }
}

bool DaemonFixture::Start() {
  Launch();
  return WaitFor(
      [&] {
        if (!process_->Running()) return true;
        return Ctl({"health", "--timeout", "1"}).exit_code == 0;
      },
      std::chrono::seconds(30)) &&
         process_->Running();
}

void DaemonFixture::Launch() {
  std::vector<std::string> argv = options_.command_prefix;
  for (std::string arg : {DaemonPath(), std::string("--config"), config_path()}) {
    argv.push_back(std::move(arg));
  }
  if (options_.supervise) argv.push_back("--supervise");
  process_ = std::make_unique<Subprocess>(argv, options_.env, log_path());
}

int DaemonFixture::Stop() {
  process_->Kill(SIGTERM);
  return process_->WaitExitCode(std::chrono::seconds(30));
}

pid_t DaemonFixture::ServingPid() {
  if (!options_.supervise) return process_->pid();
  // The supervisor's direct child.
  CommandResult r = RunCommand({"/usr/bin/pgrep", "-P", std::to_string(process_->pid())});
  return r.exit_code == 0 ? static_cast<pid_t>(std::stol(r.output)) : -1;
}

pid_t DaemonFixture::WaitForNewServingPid(pid_t old_pid) {
  pid_t pid = -1;
  const bool found = WaitFor(
      [&] {
        pid = ServingPid();
        return pid > 0 && pid != old_pid;
      },
      std::chrono::seconds(30));
  return found ? pid : -1;
}

CommandResult DaemonFixture::Ctl(std::vector<std::string> args,
                                 std::chrono::milliseconds timeout) const {
  std::vector<std::string> argv = {CtlPath(), "--endpoint", endpoint_};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, options_.ctl_env, timeout);
}

int64_t DaemonFixture::LabelOfPath(const std::string& relative_path) {
  // "class_NN/..." as written by WriteSyntheticDataset.
  size_t underscore = relative_path.find('_');
  size_t slash = relative_path.find('/');
  if (underscore == std::string::npos || slash == std::string::npos) return -1;
  return std::stoll(relative_path.substr(underscore + 1, slash - underscore - 1));
}

std::vector<SampleLine> ReadSamplesOut(const std::string& path) {
  std::vector<SampleLine> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    SampleLine s;
    fields >> s.epoch >> s.sequence >> s.sample_index >> s.label >> s.path >> s.digest;
    lines.push_back(s);
  }
  return lines;
}

v1::GetStatsResponse Stats(const std::string& endpoint) {
  auto stub = v1::Loader::NewStub(*client::MakeChannel(*client::GrpcTarget(endpoint)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStatsResponse response;
  const grpc::Status s = stub->GetStats(&context, v1::GetStatsRequest(), &response);
  if (!s.ok()) throw std::runtime_error("GetStats at " + endpoint + ": " + s.error_message());
  return response;
}

}  // namespace ringloader::testing

