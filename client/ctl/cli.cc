// SPDX-License-Identifier: Apache-2.0
// ringloaderctl's command line: flags -> one Run* function (ctl.h).
#include "absl/strings/str_cat.h"
#include "server/image/sample_decoder.h"
#include "CLI/CLI.hpp"

#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "client/client.h"
#include "client/ctl/ctl.h"
#include "server/daemon/config.h"
#include "ringloader_version.h"

namespace ringloader::ctl {
namespace {

// The flags that say which stream to read, for every command that reads one (consume, peek), so
// the same flags mean the same batches.
void AddStreamFlags(CLI::App* cmd, ConsumeOptions& o, bool& no_shuffle) {
  cmd->add_option("--dataset", o.dataset, "a dataset name from the daemon's config")->required();
  cmd->add_option("--batch-size", o.batch_size)->capture_default_str();
  cmd->add_option("--seed", o.seed)->capture_default_str();
  cmd->add_option("--rank", o.rank)->capture_default_str();
  cmd->add_option("--world-size", o.world_size)->capture_default_str();
  cmd->add_option("--image-size", o.image_size)->capture_default_str();
  cmd->add_option("--augment", o.augment)
      ->check(CLI::IsMember({"train", "eval"}))
      ->capture_default_str();
  cmd->add_flag("--no-shuffle", no_shuffle, "deliver samples in dataset order");
  cmd->add_option("--resize", o.resize,
                  "fast: DCT-scaled decoding (default) | exact: full-size decode resampled like "
                  "PIL, matching torchvision")
      ->check(CLI::IsMember({"fast", "exact"}))
      ->capture_default_str();
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"ringloaderctl: control and exercise a ringloaderd"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ringloaderctl " RINGLOADER_VERSION);
  std::string endpoint = client::DefaultEndpoint();
  app.add_option("--endpoint", endpoint,
                 "unix:/path, unix:///path or host:port (default $RINGLOADER_ENDPOINT, else "
                 "unix:/run/ringloader/ringloader.sock)")
      ->capture_default_str();
  // Mutual TLS to a TCP endpoint: the client library reads these from the environment, so a
  // flag sets its variable (and a trainer configured by environment needs no flag).
  std::string tls_ca, tls_cert, tls_key;
  app.add_option("--tls-ca", tls_ca,
                 "mutual TLS: the CA that signed the daemon's certificate (default "
                 "$RINGLOADER_TLS_CA)");
  app.add_option("--tls-cert", tls_cert,
                 "mutual TLS: this client's certificate (default $RINGLOADER_TLS_CERT)");
  app.add_option("--tls-key", tls_key,
                 "mutual TLS: this client's private key (default $RINGLOADER_TLS_KEY)");

  HealthOptions health;
  CLI::App* health_cmd = app.add_subcommand("health", "grpc.health.v1 Check (exit 0/1/2)");
  health_cmd->add_option("--timeout", health.timeout_s, "seconds")->capture_default_str();

  StatsOptions stats;
  CLI::App* stats_cmd = app.add_subcommand("stats", "the daemon's counters");
  stats_cmd->add_flag("--json", stats.json, "print GetStatsResponse as JSON");
  stats_cmd->add_flag("--watch", stats.watch, "redraw every second until interrupted");
  stats_cmd->add_option("--count", stats.watch_count, "with --watch: stop after N draws");

  TopOptions top;
  double top_delay_s = 1.0;
  CLI::App* top_cmd = app.add_subcommand(
      "top", "the daemon's streams, live (full-screen on a terminal; keys i r c d n sort, q quits)");
  top_cmd->add_option("--count", top.count, "frames to draw, then exit (0: until q)");
  top_cmd->add_option("--delay", top_delay_s, "seconds between frames")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  top_cmd->add_option("--sort", top.sort, "input (default), rate, client, dataset or id")
      ->check(CLI::IsMember({"input", "rate", "client", "dataset", "id"}));

  ConsumeOptions consume;
  CLI::App* consume_cmd = app.add_subcommand("consume", "read batches like a trainer");
  bool no_shuffle = false;
  AddStreamFlags(consume_cmd, consume, no_shuffle);
  consume_cmd->add_option("--epochs", consume.epochs, "the run ends after epoch EPOCHS-1")
      ->capture_default_str();
  consume_cmd->add_option("--dtype", consume.dtype)
      ->check(CLI::IsMember({"uint8", "float32"}))
      ->capture_default_str();
  consume_cmd->add_flag("--drop-last", consume.drop_last, "drop a final partial batch");
  uint64_t max_batches = 0;
  CLI::Option* max_batches_opt =
      consume_cmd->add_option("--max-batches", max_batches, "stop this run after N batches");
  consume_cmd->add_option("--samples-out", consume.samples_out,
                          "write one line per sample (epoch, sequence, index, label, path, "
                          "digest)");
  consume_cmd->add_option("--state", consume.state_file,
                          "resume from this file when present; save it after every batch");
  consume_cmd->add_flag("--verify", consume.verify, "verify each batch's checksum");
  consume_cmd->add_flag("--restart-epoch-if-changed", consume.restart_epoch_if_changed,
                        "resuming a --state whose dataset changed since it was saved (files "
                        "added, removed, renamed): start its epoch again instead of failing");
  consume_cmd->add_option("--reconnect-deadline-s", consume.reconnect_deadline_s)
      ->capture_default_str();

  MakeDatasetOptions make;
  CLI::App* make_cmd = app.add_subcommand("make-dataset", "write a synthetic JPEG dataset");
  make_cmd->add_option("--out", make.out_dir)->required();
  make_cmd->add_option("--count", make.count)->capture_default_str();
  make_cmd->add_option("--classes", make.classes)->capture_default_str();
  make_cmd->add_option("--seed", make.seed)->capture_default_str();
  make_cmd->add_option("--format", make.format)
      ->check(CLI::IsMember({"imagefolder", "webdataset", "tfrecord", "arrays"}))
      ->capture_default_str();
  make_cmd->add_option("--shard-size", make.shard_size, "samples per shard (webdataset, tfrecord)")
      ->capture_default_str();
  make_cmd->add_option("--image-size", make.image_size, "arrays: images.npy is [N, S, S, 3]")
      ->capture_default_str();
  make_cmd->add_option("--label-base", make.label_base,
                       "tfrecord: added to every label (1: labels 1..K, for label_offset = -1)")
      ->capture_default_str();

  ConvertOptions convert;
  CLI::App* convert_cmd =
      app.add_subcommand("convert", "rewrite an imagefolder as WebDataset or TFRecord shards");
  convert_cmd->add_option("--from", convert.from)
      ->check(CLI::IsMember({"imagefolder"}))
      ->capture_default_str();
  convert_cmd->add_option("--to", convert.to)
      ->check(CLI::IsMember({"webdataset", "tfrecord"}))
      ->required();
  convert_cmd->add_option("--path", convert.path, "the imagefolder's root")->required();
  convert_cmd->add_option("--out", convert.out_dir, "destination directory (created)")
      ->required();
  convert_cmd->add_option("--shard-size", convert.shard_size, "samples per shard")
      ->capture_default_str();

  PeekOptions peek;
  CLI::App* peek_cmd = app.add_subcommand(
      "peek", "write one batch as a trainer receives it as a contact sheet (PNG or JPEG)");
  bool peek_no_shuffle = false;
  AddStreamFlags(peek_cmd, peek.stream, peek_no_shuffle);
  peek_cmd->add_option("--epoch", peek.epoch)->capture_default_str();
  peek_cmd->add_option("--batch", peek.batch, "batch index within the epoch")->capture_default_str();
  peek_cmd->add_option("--columns", peek.columns, "tiles per row")->capture_default_str();
  peek_cmd->add_option("--out", peek.out, "sheet.png (lossless) or sheet.jpg; legend: sheet.tsv")
      ->required();

  DoctorOptions doctor;
  CLI::App* doctor_cmd = app.add_subcommand(
      "doctor", "check this host against a daemon config (exit 1 on any problem)");
  CLI::Option* doctor_config =
      doctor_cmd->add_option("--config", doctor.config, "the daemon's config")
          ->capture_default_str();
  doctor_cmd->add_flag("--live", doctor.live,
                       "only the running daemon (--endpoint, or the --config's listen): what "
                       "limits each input-bound stream, and what to change");
  doctor_cmd->add_option("--batch-size", doctor.batch_size, "stream shape the rings are sized for")
      ->capture_default_str();
  doctor_cmd->add_option("--image-size", doctor.image_size, "stream shape the rings are sized for")
      ->capture_default_str();
  doctor_cmd->add_option("--cgroup", doctor.cgroup,
                         "the daemon's memory cgroup directory (default: this process's)");
  doctor_cmd->add_option("--dataset-timeout-s", doctor.dataset_timeout_s,
                         "a dataset whose indexing takes longer is reported as not answering")
      ->capture_default_str();
  doctor_cmd->add_option("--daemon-timeout-s", doctor.daemon_timeout_s,
                         "a running daemon that does not answer in this time is a problem")
      ->capture_default_str();

  ValidateOptions validate;
  CLI::App* validate_cmd = app.add_subcommand("validate", "decode every sample of a dataset");
  validate_cmd->add_option("--format", validate.format)
      ->check(CLI::IsMember({"imagefolder", "manifest", "webdataset", "tfrecord", "arrays"}))
      ->capture_default_str();
  validate_cmd->add_option("--config", validate.config,
                           "a ringloaderd config: check --dataset with exactly its limits");
  validate_cmd->add_option("--dataset", validate.dataset, "a dataset name of --config");
  validate_cmd->add_option("--path", validate.path,
                           "the dataset root, or shard pattern (without --config)");
  validate_cmd->add_option("--manifest", validate.manifest, "manifest file (format manifest)");
  validate_cmd->add_option("--label", validate.label,
                           "arrays: the NAME.npy whose rows are the labels (config's `label`)");
  validate_cmd->add_option("--jobs", validate.jobs, "decode threads (0 = one per CPU)")
      ->capture_default_str();
  validate_cmd->add_option("--io-depth", validate.io_depth,
                           "files opened ahead of the decodes, at once (a network mount's "
                           "latency per file); 0 = none")
      ->capture_default_str();
  validate_cmd->add_option("--deadline-ms", validate.deadline_ms,
                           "a read that takes longer while the storage answers others is BAD "
                           "(deadline_exceeded); 0 = none")
      ->capture_default_str();
  uint64_t max_pixels = 0;
  CLI::Option* max_pixels_opt = validate_cmd->add_option(
      "--max-pixels", max_pixels,
      absl::StrCat("override max_pixels (default: the config's, else ",
                   image::DecodeLimits{}.max_pixels, ", the daemon's default)"));

  QuarantineOptions quarantine;
  CLI::App* quarantine_cmd = app.add_subcommand("quarantine", "samples that crashed the daemon");
  quarantine_cmd->require_subcommand(1);
  CLI::App* list_cmd = quarantine_cmd->add_subcommand("list", "list quarantined samples");
  CLI::App* clear_cmd = quarantine_cmd->add_subcommand("clear", "forget quarantined samples");
  clear_cmd->add_option("--dataset", quarantine.dataset, "only this dataset (default all)");
  clear_cmd->add_option("--admin-endpoint", quarantine.admin_endpoint,
                        "the daemon's admin socket (default: the endpoint's, e.g. "
                        "unix:/run/ringloader/ringloader-admin.sock)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  for (const auto& [name, value] : {std::pair<const char*, const std::string&>{
                                        "RINGLOADER_TLS_CA", tls_ca},
                                    {"RINGLOADER_TLS_CERT", tls_cert},
                                    {"RINGLOADER_TLS_KEY", tls_key}}) {
    if (!value.empty()) ::setenv(name, value.c_str(), 1);
  }

  if (*health_cmd) {
    health.endpoint = endpoint;
    return RunHealth(health, std::cout);
  }
  if (*stats_cmd) {
    stats.endpoint = endpoint;
    stats.clear = stats.watch && isatty(STDOUT_FILENO) == 1;
    return RunStats(stats, std::cout, std::cerr);
  }
  if (*top_cmd) {
    top.endpoint = endpoint;
    top.screen = isatty(STDOUT_FILENO) == 1 && isatty(STDIN_FILENO) == 1;
    top.delay = std::chrono::milliseconds(static_cast<int64_t>(top_delay_s * 1000));
    // --sort takes words; the view takes their keys (input -> 'i', rate -> 'r', id -> 'n').
    if (top.sort == "id") top.sort = "n";
    return RunTop(top, std::cout, std::cerr);
  }
  if (*consume_cmd) {
    consume.endpoint = endpoint;
    consume.shuffle = !no_shuffle;
    if (*max_batches_opt) consume.max_batches = max_batches;
    consume.progress = isatty(STDERR_FILENO) == 1;
    return RunConsume(consume, std::cout, std::cerr);
  }
  if (*make_cmd) return RunMakeDataset(make, std::cout, std::cerr);
  if (*convert_cmd) return RunConvert(convert, std::cout, std::cerr);
  if (*doctor_cmd) {
    doctor.endpoint = endpoint;
    if (doctor.live && doctor_config->count() > 0) {
      absl::StatusOr<server::DaemonConfig> config = server::LoadConfig(doctor.config);
      if (!config.ok()) {
        std::cerr << "ringloaderctl doctor: " << config.status().message() << "\n";
        return kExitUsage;
      }
      doctor.endpoint = config->server.listen;
    }
    return RunDoctor(doctor, std::cout, std::cerr);
  }
  if (*peek_cmd) {
    peek.endpoint = endpoint;
    peek.stream.shuffle = !peek_no_shuffle;
    return RunPeek(peek, std::cout, std::cerr);
  }
  if (*validate_cmd) {
    if (*max_pixels_opt) validate.max_pixels = max_pixels;
    return RunValidate(validate, std::cout, std::cerr);
  }
  quarantine.endpoint = endpoint;
  if (*list_cmd) return RunQuarantineList(quarantine, std::cout, std::cerr);
  return RunQuarantineClear(quarantine, std::cout, std::cerr);
}

}  // namespace ringloader::ctl
