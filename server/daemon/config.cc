// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/config.h"

#include <arpa/inet.h>
#include <grp.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <map>
#include <optional>
#include <set>
#include <cstring>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "shm/base/x509.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ringloader::server {
namespace {

// Reads typed keys out of one TOML table, remembering which keys it was asked about so that
// the rest can be reported as unknown. The first error wins; later reads become no-ops.
class TableReader {
 public:
  TableReader(const toml::table& table, std::string path, std::string source, absl::Status* error)
      : table_(table), path_(std::move(path)), source_(std::move(source)), error_(error) {}

  std::string KeyPath(const std::string& key) const {
    return path_.empty() ? key : absl::StrCat(path_, ".", key);
  }

  // Records the first error and returns it.
  absl::Status Fail(const std::string& key, const std::string& rule, const std::string& got) {
    if (error_->ok()) {
      *error_ = absl::InvalidArgumentError(
          absl::StrCat(source_, ": ", KeyPath(key), ": ", rule, got.empty() ? "" : " (got ",
                       got, got.empty() ? "" : ")"));
    }
    return *error_;
  }
  void Flag(const std::string& key, const std::string& rule, const std::string& got) {
    Fail(key, rule, got).IgnoreError();
  }

  const toml::node* Get(const std::string& key) {
    known_.insert(std::string(key));
    return table_.get(key);
  }

  void String(const std::string& key, std::string* out, bool required = false) {
    const toml::node* node = Get(key);
    if (node == nullptr) {
      if (required) Flag(key, "is required", "");
      return;
    }
    if (!node->is_string()) {
      Flag(key, "must be a string", Describe(*node));
      return;
    }
    *out = node->as_string()->get();
  }

  // A string or an array of strings; `separator` also splits a single string ("jpg;jpeg").
  void StringList(const std::string& key, std::vector<std::string>* out, char separator = '\0') {
    const toml::node* node = Get(key);
    if (node == nullptr) return;
    std::vector<std::string> values;
    if (node->is_string()) {
      const std::string& text = node->as_string()->get();
      if (separator == '\0') {
        values.push_back(text);
      } else {
        values = absl::StrSplit(text, separator, absl::SkipEmpty());
      }
    } else if (const toml::array* array = node->as_array()) {
      for (const toml::node& item : *array) {
        if (!item.is_string()) {
          Flag(key, "must be a list of strings", Describe(*node));
          return;
        }
        values.push_back(item.as_string()->get());
      }
    } else {
      Flag(key, "must be a string or a list of strings", Describe(*node));
      return;
    }
    *out = std::move(values);
  }

  template <typename T>
  void Integer(const std::string& key, T* out, int64_t min, int64_t max) {
    const toml::node* node = Get(key);
    if (node == nullptr) return;
    if (!node->is_integer()) {
      Flag(key, "must be an integer", Describe(*node));
      return;
    }
    int64_t v = node->as_integer()->get();
    if (v < min || v > max) {
      Flag(key, absl::StrCat("must be in [", min, ", ", max, "]"), std::to_string(v));
      return;
    }
    *out = static_cast<T>(v);
  }

  void Bool(const std::string& key, bool* out) {
    const toml::node* node = Get(key);
    if (node == nullptr) return;
    if (!node->is_boolean()) {
      Flag(key, "must be true or false", Describe(*node));
      return;
    }
    *out = node->as_boolean()->get();
  }

  // A byte size: an integer (bytes) or a string like "4GiB".
  void ByteSize(const std::string& key, uint64_t* out, uint64_t min) {
    const toml::node* node = Get(key);
    if (node == nullptr) return;
    uint64_t v = 0;
    if (node->is_integer()) {
      if (node->as_integer()->get() < 0) {
        Flag(key, "must be >= 0", std::to_string(node->as_integer()->get()));
        return;
      }
      v = static_cast<uint64_t>(node->as_integer()->get());
    } else if (node->is_string()) {
      auto parsed = ParseByteSize(node->as_string()->get());
      if (!parsed.ok()) {
        Flag(key, "must be a size such as \"4GiB\", \"512MiB\" or a byte count",
             absl::StrCat("\"", node->as_string()->get(), "\""));
        return;
      }
      v = *parsed;
    } else {
      Flag(key, "must be a size such as \"4GiB\"", Describe(*node));
      return;
    }
    if (v < min) {
      Flag(key, absl::StrCat("must be >= ", min, " bytes"), std::to_string(v));
      return;
    }
    *out = v;
  }

  // A file mode written as a string of octal digits, e.g. "0660".
  void Mode(const std::string& key, mode_t* out) {
    const toml::node* node = Get(key);
    if (node == nullptr) return;
    if (!node->is_string()) {
      Flag(key, "must be an octal string such as \"0660\"", Describe(*node));
      return;
    }
    const std::string& s = node->as_string()->get();
    unsigned v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 8);
    if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || v > 0777) {
      Flag(key, "must be an octal mode such as \"0660\"", absl::StrCat("\"", s, "\""));
      return;
    }
    *out = static_cast<mode_t>(v);
  }

  // One of `choices`; returns its index through `out`.
  void Enum(const std::string& key, const std::vector<std::string>& choices, int* out) {
    std::string value;
    const toml::node* node = table_.get(key);
    if (node == nullptr) {
      known_.insert(std::string(key));
      return;
    }
    String(key, &value);
    if (!error_->ok()) return;
    for (size_t i = 0; i < choices.size(); ++i) {
      if (value == choices[i]) {
        *out = static_cast<int>(i);
        return;
      }
    }
    Flag(key, absl::StrCat("must be one of ", absl::StrJoin(choices, ", ")),
         absl::StrCat("\"", value, "\""));
  }

  void RejectUnknown() {
    for (const auto& [k, v] : table_) {
      if (!known_.count(std::string(k.str()))) {
        Flag(std::string(k.str()), "unknown key", "");
        return;
      }
    }
  }

  static std::string Describe(const toml::node& node) {
    switch (node.type()) {
      case toml::node_type::string: return absl::StrCat("\"", node.as_string()->get(), "\"");
      case toml::node_type::integer: return std::to_string(node.as_integer()->get());
      case toml::node_type::floating_point: return std::to_string(node.as_floating_point()->get());
      case toml::node_type::boolean: return node.as_boolean()->get() ? "true" : "false";
      case toml::node_type::table: return "a table";
      case toml::node_type::array: return "an array";
      default: return "a date/time";
    }
  }

 private:
  const toml::table& table_;
  std::string path_;
  std::string source_;
  absl::Status* error_;
  std::set<std::string> known_;
};

absl::Status ParseServer(const toml::table& table, const std::string& source, ServerConfig* s) {
  absl::Status error;
  TableReader r(table, "server", source, &error);
  r.String("listen", &s->listen);
  r.String("health_listen", &s->health_listen);
  r.Mode("socket_mode", &s->socket_mode);
  r.String("socket_group", &s->socket_group);
  r.String("admin_listen", &s->admin_listen);
  r.String("admin_group", &s->admin_group);
  r.String("state_dir", &s->state_dir);
  int level = -1;
  r.Enum("log_level", {"trace", "debug", "info", "warn", "error", "critical", "off"}, &level);
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (level >= 0) s->log_level = kLevels[level];
  int format = -1;
  r.Enum("log_format", {"plain", "timestamped"}, &format);
  if (format >= 0) s->log_format = format == 0 ? LogFormat::kPlain : LogFormat::kTimestamped;
  r.Integer("decode_threads", &s->decode_threads, 0, 1024);
  r.Integer("io_depth", &s->io_depth, 0, 4096);
  r.ByteSize("memory_limit", &s->memory_limit_bytes, 16ull << 20);
  r.String("shm_dir", &s->shm_dir);
  r.Mode("segment_mode", &s->segment_mode);
  r.String("segment_group", &s->segment_group);
  r.Integer("ring_slots", &s->ring_slots, 0, 1024);
  r.Integer("max_ring_slots", &s->max_ring_slots, 2, 1024);
  r.Integer("max_batch_size", &s->max_batch_size, 1, 1 << 20);
  r.Integer("max_image_size", &s->max_image_size, 8, 16384);
  r.Integer("max_streams", &s->max_streams, 1, 4096);
  r.Integer("max_streams_per_client", &s->max_streams_per_client, 1, 4096);
  r.Integer("stream_idle_timeout_ms", &s->stream_idle_timeout_ms, 100, 86'400'000);
  r.Integer("max_wait_ms", &s->max_wait_ms, 1, 60'000);
  r.Integer("decode_deadline_ms", &s->decode_deadline_ms, 0, 86'400'000);
  r.Integer("io_retry_ms", &s->io_retry_ms, 0, 86'400'000);
  r.Integer("watchdog_ms", &s->watchdog_ms, 0, 86'400'000);
  r.String("metrics_listen", &s->metrics_listen);
  r.Bool("insecure_tcp", &s->insecure_tcp);
  r.String("feeder_listen", &s->feeder_listen);
  r.String("feeder_data_listen", &s->feeder_data_listen);
  r.Bool("local_decode", &s->local_decode);
  r.Integer("feeder_lease_ms", &s->feeder_lease_ms, 100, 600'000);
  r.RejectUnknown();
  if (!error.ok()) return error;
  if (absl::Status listen = ValidateListen(s->listen); !listen.ok()) {
    return r.Fail("listen", std::string(listen.message()), absl::StrCat("\"", s->listen, "\""));
  }
  if (!s->health_listen.empty()) {
    if (absl::Status h = ValidateListen(s->health_listen); !h.ok()) {
      return r.Fail("health_listen", std::string(h.message()),
                    absl::StrCat("\"", s->health_listen, "\""));
    }
    if (s->health_listen == s->listen) {
      return r.Fail("health_listen", "must differ from listen",
                    absl::StrCat("\"", s->health_listen, "\""));
    }
  }
  if (!s->metrics_listen.empty()) {
    // HTTP: TCP only (Prometheus scrapes over the network).
    absl::Status m = absl::StartsWith(s->metrics_listen, "unix:")
                         ? absl::InvalidArgumentError("must be HOST:PORT (HTTP over TCP)")
                         : ValidateListen(s->metrics_listen);
    if (m.ok() && (s->metrics_listen == s->listen || s->metrics_listen == s->health_listen)) {
      m = absl::InvalidArgumentError("must differ from listen and health_listen");
    }
    if (!m.ok()) {
      return r.Fail("metrics_listen", std::string(m.message()),
                    absl::StrCat("\"", s->metrics_listen, "\""));
    }
  }
  if (!s->feeder_listen.empty()) {
    absl::Status f = absl::StartsWith(s->feeder_listen, "unix:")
                         ? absl::InvalidArgumentError("must be HOST:PORT (other hosts dial it)")
                         : ValidateListen(s->feeder_listen);
    if (f.ok() && (s->feeder_listen == s->listen || s->feeder_listen == s->health_listen ||
                   s->feeder_listen == s->metrics_listen)) {
      f = absl::InvalidArgumentError("must differ from listen, health_listen and metrics_listen");
    }
    if (!f.ok()) {
      return r.Fail("feeder_listen", std::string(f.message()),
                    absl::StrCat("\"", s->feeder_listen, "\""));
    }
  }
  if (!s->feeder_data_listen.empty()) {
    const std::string& d = s->feeder_data_listen;
    absl::Status f = absl::StartsWith(d, "unix:")
                         ? absl::InvalidArgumentError("must be HOST:PORT (other hosts dial it)")
                         : ValidateListen(d);
    if (f.ok() && s->feeder_listen.empty()) {
      f = absl::InvalidArgumentError(
          "needs server.feeder_listen (hosts learn of the data port from its answers)");
    }
    if (f.ok() && (d == s->listen || d == s->health_listen || d == s->metrics_listen ||
                   d == s->feeder_listen)) {
      f = absl::InvalidArgumentError(
          "must differ from listen, health_listen, metrics_listen and feeder_listen");
    }
    std::string data_host, feeder_host, ignored;
    if (f.ok() && SplitHostPort(d, &data_host, &ignored) &&
        SplitHostPort(s->feeder_listen, &feeder_host, &ignored) &&
        !ListensWhere(data_host, feeder_host)) {
      f = absl::InvalidArgumentError(absl::StrCat(
          "must listen where feeder_listen does (on ", feeder_host,
          ", or on every address: \"[::]:PORT\", or \"0.0.0.0:PORT\" beside an IPv4 "
          "feeder_listen): hosts dial the data port at the address they reached feeder_listen "
          "at"));
    }
    if (!f.ok()) {
      return r.Fail("feeder_data_listen", std::string(f.message()), absl::StrCat("\"", d, "\""));
    }
  }
  if (!s->admin_listen.empty() &&
      (!absl::StartsWith(s->admin_listen, "unix:") || s->admin_listen.size() == 5 ||
       s->admin_listen == s->listen || s->admin_listen == s->health_listen)) {
    return r.Fail("admin_listen",
                  "must be unix:PATH (a socket the kernel guards), other than listen and "
                  "health_listen",
                  absl::StrCat("\"", s->admin_listen, "\""));
  }
  if (s->state_dir.empty()) return r.Fail("state_dir", "must not be empty", "");
  if ((s->segment_mode & 0022) != 0) {
    return r.Fail("segment_mode",
                  "must not let group or others write: trainers map rings read-only, and a ring "
                  "anyone can write is a ring anyone can corrupt",
                  absl::StrFormat("\"%04o\"", s->segment_mode));
  }
  if (s->ring_slots == 1) {
    return r.Fail("ring_slots", "must be 0 (4, or 3 for batches over 8 MiB) or in [2, 1024]", "1");
  }
  if (table.get("io_retry_ms") == nullptr) {
    // Unset: two thirds of the deadline, so a sample's retries end inside it.
    s->io_retry_ms = s->decode_deadline_ms != 0 ? s->decode_deadline_ms / 3 * 2 : 20'000;
  }
  if (s->decode_deadline_ms != 0 && s->io_retry_ms >= s->decode_deadline_ms) {
    // A sample's retries run inside its deadline: a budget that reaches it would end a
    // persistent EIO as deadline_exceeded with an abandoned thread, never as io_error.
    return r.Fail("io_retry_ms",
                  absl::StrCat("must be below decode_deadline_ms (", s->decode_deadline_ms,
                               "): a sample's reads are retried within its deadline"),
                  std::to_string(s->io_retry_ms));
  }
  if (s->ring_slots > s->max_ring_slots) {
    return r.Fail("ring_slots", absl::StrCat("must be <= max_ring_slots (", s->max_ring_slots, ")"),
                  std::to_string(s->ring_slots));
  }
  return absl::OkStatus();
}

// The `format` words, in the order of pipeline::DatasetFormat (this library links no pipeline).
constexpr const char* kFormatNames[] = {"imagefolder", "manifest", "webdataset", "tfrecord",
                                        "arrays"};

absl::Status ParseDataset(const toml::table& table, const std::string& path,
                          const std::string& source, DatasetConfig* d) {
  absl::Status error;
  TableReader r(table, path, source, &error);
  r.String("name", &d->name, /*required=*/true);
  int format = -1;
  r.Enum("format", std::vector<std::string>(std::begin(kFormatNames), std::end(kFormatNames)),
         &format);
  if (format >= 0) d->format = static_cast<pipeline::DatasetFormat>(format);
  r.String("path", &d->path, /*required=*/true);
  r.String("manifest", &d->manifest);
  r.StringList("image_key", &d->image_key, ';');
  r.String("label_key", &d->label_key);
  r.String("image_feature", &d->image_feature);
  r.String("label_feature", &d->label_feature);
  r.Integer("label_offset", &d->label_offset, -(int64_t{1} << 40), int64_t{1} << 40);
  r.String("label", &d->label);
  r.StringList("ragged", &d->ragged);
  r.Integer("ragged_max_rows", &d->ragged_max_rows, 1, int64_t{1} << 40);
  int cache = -1;
  r.Enum("cache", {"none", "memory"}, &cache);
  if (cache >= 0) d->cache_memory = cache == 1;
  int on_error = -1;
  r.Enum("on_error", {"skip", "fail"}, &on_error);
  if (on_error == 1) d->on_error = pipeline::OnError::kFail;
  r.Integer("max_pixels", &d->max_pixels, 1, int64_t{1} << 40);
  r.ByteSize("max_file_bytes", &d->max_file_bytes, 1024);
  r.Bool("warnings_are_errors", &d->warnings_are_errors);
  r.Integer("max_scans", &d->max_scans, 1, 100'000);
  r.RejectUnknown();
  if (!error.ok()) return error;
  if (table.get("format") == nullptr) return r.Fail("format", "is required", "");
  if (d->name.empty()) return r.Fail("name", "must not be empty", "");
  for (char c : d->name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return r.Fail("name", "may contain only letters, digits, '-', '_' and '.'",
                    absl::StrCat("\"", d->name, "\""));
    }
  }
  if (d->path.empty() || d->path[0] != '/') {
    return r.Fail("path", "must be an absolute path", absl::StrCat("\"", d->path, "\""));
  }
  if (d->format == pipeline::DatasetFormat::kManifest && d->manifest.empty()) {
    return r.Fail("manifest", "is required when format = \"manifest\"", "");
  }
  if (d->format != pipeline::DatasetFormat::kManifest && !d->manifest.empty()) {
    return r.Fail("manifest", "is only valid with format = \"manifest\"", "");
  }
  // Keys of one format given to another are mistakes, not defaults to ignore.
  const auto only_with = [&](const char* key, pipeline::DatasetFormat f) {
    if (table.get(key) != nullptr && d->format != f) {
      r.Flag(key, absl::StrCat("is only valid with format = \"",
                               kFormatNames[static_cast<int>(f)], "\""), "");
    }
  };
  for (const char* key : {"image_key", "label_key", "ragged", "ragged_max_rows"}) {
    only_with(key, pipeline::DatasetFormat::kWebDataset);
  }
  for (const char* key : {"image_feature", "label_feature", "label_offset"}) {
    only_with(key, pipeline::DatasetFormat::kTfRecord);
  }
  only_with("label", pipeline::DatasetFormat::kArrays);
  if (!error.ok()) return error;
  if (d->image_key.empty()) return r.Fail("image_key", "must name at least one extension", "\"\"");
  if (d->image_feature.empty()) return r.Fail("image_feature", "must not be empty", "\"\"");
  if (d->label_key.rfind("json:", 0) == 0 && d->label_key.size() == 5) {
    return r.Fail("label_key", "\"json:FIELD\" needs a FIELD", "\"json:\"");
  }
  return absl::OkStatus();
}

absl::Status ParseTls(const toml::table& table, const std::string& source, TlsConfig* t) {
  absl::Status error;
  TableReader r(table, "tls", source, &error);
  r.String("ca", &t->ca, /*required=*/true);
  r.String("cert", &t->cert, /*required=*/true);
  r.String("key", &t->key, /*required=*/true);
  r.StringList("allowed_clients", &t->allowed_clients);
  r.RejectUnknown();
  if (!error.ok()) return error;
  for (const auto& [key, value] : {std::pair<const char*, const std::string&>{"ca", t->ca},
                                   {"cert", t->cert},
                                   {"key", t->key}}) {
    if (value.empty()) return r.Fail(key, "must name a PEM file", "\"\"");
  }
  for (const std::string& pattern : t->allowed_clients) {
    if (pattern.empty()) return r.Fail("allowed_clients", "must not hold an empty name", "\"\"");
    if (absl::Status s = base::CheckNamePattern(pattern); !s.ok()) {
      return r.Fail("allowed_clients", std::string(s.message()), "");
    }
  }
  return absl::OkStatus();
}

constexpr const char* kIoFaultErrnos[] = {"EIO",    "EMFILE", "ENFILE",   "ENOMEM",
                                          "EAGAIN", "ESTALE", "ETIMEDOUT"};

absl::Status ParseFailpoints(const toml::table& table, const std::string& source,
                             FailpointConfig* f) {
  absl::Status error;
  TableReader r(table, "failpoints", source, &error);
  int action = -1;
  r.Enum("action", {"none", "abort", "segfault", "oom", "hang", "hang_decode"}, &action);
  if (action >= 0) f->action = static_cast<FailpointConfig::Action>(action);
  r.String("crash_on_path", &f->crash_on_path);
  r.Integer("after_batches", &f->after_batches, 0, int64_t{1} << 50);
  r.Integer("index_delay_ms", &f->index_delay_ms, 0, 3'600'000);
  r.String("io_fault_path", &f->io_fault_path);
  int err = -1;
  r.Enum("io_fault_errno", std::vector<std::string>(std::begin(kIoFaultErrnos),
                                                    std::end(kIoFaultErrnos)), &err);
  if (err >= 0) f->io_fault_errno = kIoFaultErrnos[err];
  r.Integer("io_fault_times", &f->io_fault_times, 1, 1'000'000);
  r.Integer("session_end_delay_ms", &f->session_end_delay_ms, 0, 60'000);
  r.Integer("open_delay_ms", &f->open_delay_ms, 0, 60'000);
  const std::vector<std::string> lies = {"", "checksum", "index", "label", "short", "slow"};
  int lie = -1;
  r.Enum("feed_lie", lies, &lie);
  if (lie > 0) f->feed_lie = lies[lie];
  r.Integer("feeder_resolve_ms", &f->feeder_resolve_ms, 0, 3'600'000);
  r.RejectUnknown();
  if (!error.ok()) return error;
  if (f->enabled() && f->crash_on_path.empty() && f->after_batches == 0) {
    return r.Fail("action", "needs crash_on_path or after_batches to say when", "");
  }
  return absl::OkStatus();
}

}  // namespace

pipeline::DatasetSpec DatasetSpecOf(const DatasetConfig& dataset, const std::string& state_dir) {
  pipeline::DatasetSpec spec;
  spec.name = dataset.name;
  spec.format = dataset.format;
  spec.root = dataset.path;
  spec.manifest_path = dataset.manifest;
  spec.state_dir = state_dir;
  spec.image_keys = dataset.image_key;
  spec.label_key = dataset.label_key;
  spec.image_feature = dataset.image_feature;
  spec.label_feature = dataset.label_feature;
  spec.label_offset = dataset.label_offset;
  spec.label_array = dataset.label;
  spec.ragged = dataset.ragged;
  spec.ragged_max_rows = dataset.ragged_max_rows;
  return spec;
}

image::DecodeLimits DecodeLimitsOf(const DatasetConfig& dataset) {
  image::DecodeLimits limits;
  limits.max_pixels = dataset.max_pixels;
  limits.max_file_bytes = dataset.max_file_bytes;
  limits.warnings_are_errors = dataset.warnings_are_errors;
  limits.max_scans = dataset.max_scans;
  return limits;
}

const DatasetConfig* DaemonConfig::FindDataset(std::string_view name) const {
  for (const auto& d : datasets) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text_view) {
  const std::string text(text_view);
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  uint64_t number = 0;
  if (digits == 0 || !absl::SimpleAtoi(s.substr(0, digits), &number)) {
    return absl::InvalidArgumentError(absl::StrCat("not a size: \"", text, "\""));
  }
  // Case-sensitive on purpose: "Mb" is megabits to many readers, so no spelling is guessed.
  std::string unit(absl::StripAsciiWhitespace(s.substr(digits)));
  static const std::map<std::string, uint64_t> kUnits = {
      {"", 1},           {"B", 1},
      {"kB", 1000},      {"KB", 1000},        {"MB", 1000000},     {"GB", 1000000000},
      {"TB", 1000000000000ull},
      {"KiB", 1 << 10},  {"MiB", 1 << 20},    {"GiB", 1ull << 30}, {"TiB", 1ull << 40}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown size unit \"", unit, "\" (use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)"));
  }
  if (number > UINT64_MAX / it->second) {
    return absl::InvalidArgumentError(absl::StrCat("size too large: \"", text, "\""));
  }
  return number * it->second;
}

namespace {

// An IP as 16 bytes (an IPv4 one v4-mapped), or nullopt for a name.
std::optional<std::array<uint8_t, 16>> ParseIp(const std::string& host) {
  std::array<uint8_t, 16> ip{};
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    ip[10] = ip[11] = 0xff;
    std::memcpy(ip.data() + 12, &v4, 4);
    return ip;
  }
  if (inet_pton(AF_INET6, host.c_str(), ip.data()) == 1) return ip;
  return std::nullopt;
}

bool IsV4(const std::array<uint8_t, 16>& ip) {
  return std::all_of(ip.begin(), ip.begin() + 10, [](uint8_t b) { return b == 0; }) &&
         ip[10] == 0xff && ip[11] == 0xff;
}

}  // namespace

bool ListensWhere(const std::string& data_host, const std::string& feeder_host) {
  const std::optional<std::array<uint8_t, 16>> data = ParseIp(data_host);
  const std::optional<std::array<uint8_t, 16>> feeder = ParseIp(feeder_host);
  static constexpr std::array<uint8_t, 16> kAnyV6{};
  static constexpr std::array<uint8_t, 16> kAnyV4{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (data && *data == kAnyV6) return true;  // every address, IPv4's too (dual-stack)
  // IPv6 hosts could not reach it; beside a name, which may be either, it is let be.
  if (data && *data == kAnyV4) return !feeder || IsV4(*feeder);
  if (!data || !feeder) return data_host == feeder_host;  // a name: only itself
  return *data == *feeder;
}

bool SplitHostPort(const std::string& listen, std::string* host, std::string* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size()) return false;
  *host = listen.substr(0, colon);
  *port = listen.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !host->empty();
}

absl::Status ValidateListen(std::string_view listen_view) {
  const std::string listen(listen_view);
  if (listen.empty()) return absl::InvalidArgumentError("must not be empty");
  if (absl::StartsWith(listen, "unix:")) {
    if (listen.size() == 5) return absl::InvalidArgumentError("unix: needs a socket path");
    return absl::OkStatus();
  }
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError("must be \"unix:PATH\" or \"HOST:PORT\"");
  }
  const std::string host = listen.substr(0, colon);
  if (host.front() == '[' ? host.back() != ']' : host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError("an IPv6 host must be in brackets: \"[::1]:PORT\"");
  }
  const std::string port = listen.substr(colon + 1);
  uint32_t value = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &value) || value < 1 || value > 65535) {
    return absl::InvalidArgumentError("port must be a number in [1, 65535]");
  }
  return absl::OkStatus();
}

std::vector<std::string> ChangedServerKeys(const ServerConfig& a, const ServerConfig& b) {
  std::vector<std::string> keys;
  const auto check = [&](bool same, const char* key) {
    if (!same) keys.push_back(absl::StrCat("server.", key));
  };
  check(a.listen == b.listen, "listen");
  check(a.socket_mode == b.socket_mode, "socket_mode");
  check(a.socket_group == b.socket_group, "socket_group");
  check(a.admin_listen == b.admin_listen, "admin_listen");
  check(a.admin_group == b.admin_group, "admin_group");
  check(a.state_dir == b.state_dir, "state_dir");
  check(a.log_level == b.log_level, "log_level");
  check(a.log_format == b.log_format, "log_format");
  check(a.decode_threads == b.decode_threads, "decode_threads");
  check(a.io_depth == b.io_depth, "io_depth");
  check(a.memory_limit_bytes == b.memory_limit_bytes, "memory_limit");
  check(a.shm_dir == b.shm_dir, "shm_dir");
  check(a.segment_mode == b.segment_mode, "segment_mode");
  check(a.segment_group == b.segment_group, "segment_group");
  check(a.ring_slots == b.ring_slots, "ring_slots");
  check(a.max_ring_slots == b.max_ring_slots, "max_ring_slots");
  check(a.max_batch_size == b.max_batch_size, "max_batch_size");
  check(a.max_image_size == b.max_image_size, "max_image_size");
  check(a.max_streams == b.max_streams, "max_streams");
  check(a.max_streams_per_client == b.max_streams_per_client, "max_streams_per_client");
  check(a.stream_idle_timeout_ms == b.stream_idle_timeout_ms, "stream_idle_timeout_ms");
  check(a.max_wait_ms == b.max_wait_ms, "max_wait_ms");
  check(a.decode_deadline_ms == b.decode_deadline_ms, "decode_deadline_ms");
  check(a.io_retry_ms == b.io_retry_ms, "io_retry_ms");
  check(a.health_listen == b.health_listen, "health_listen");
  check(a.watchdog_ms == b.watchdog_ms, "watchdog_ms");
  check(a.metrics_listen == b.metrics_listen, "metrics_listen");
  check(a.insecure_tcp == b.insecure_tcp, "insecure_tcp");
  check(a.feeder_listen == b.feeder_listen, "feeder_listen");
  check(a.feeder_data_listen == b.feeder_data_listen, "feeder_data_listen");
  check(a.local_decode == b.local_decode, "local_decode");
  check(a.feeder_lease_ms == b.feeder_lease_ms, "feeder_lease_ms");
  return keys;
}

absl::StatusOr<FailpointConfig> ParseFailpointSpec(std::string_view spec_view) {
  const std::string spec(spec_view);
  FailpointConfig f;
  for (absl::string_view part : absl::StrSplit(spec, ';', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (key == "action") {
      if (value == "abort") f.action = FailpointConfig::Action::kAbort;
      else if (value == "segfault") f.action = FailpointConfig::Action::kSegfault;
      else if (value == "oom") f.action = FailpointConfig::Action::kOom;
      else if (value == "hang") f.action = FailpointConfig::Action::kHang;
      else if (value == "hang_decode") f.action = FailpointConfig::Action::kHangDecode;
      else if (value == "none") f.action = FailpointConfig::Action::kNone;
      else return absl::InvalidArgumentError(absl::StrCat(
          "RINGLOADER_FAILPOINTS: action: must be abort, segfault, oom, hang, hang_decode or none "
          "(got \"", value,
          "\")"));
    } else if (key == "crash_on_path") {
      f.crash_on_path = std::string(value.data(), value.size());
    } else if (key == "after_batches") {
      if (!absl::SimpleAtoi(value, &f.after_batches)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "RINGLOADER_FAILPOINTS: after_batches: must be an integer (got \"", value, "\")"));
      }
    } else if (key == "index_delay_ms") {
      if (!absl::SimpleAtoi(value, &f.index_delay_ms) || f.index_delay_ms > 3'600'000) {
        return absl::InvalidArgumentError(absl::StrCat(
            "RINGLOADER_FAILPOINTS: index_delay_ms: must be an integer in [0, 3600000] (got \"",
            value, "\")"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("RINGLOADER_FAILPOINTS: unknown key \"", key, "\""));
    }
  }
  return f;
}

absl::StatusOr<DaemonConfig> ParseConfig(std::string_view toml_text, const std::string& source) {
  DaemonConfig config;
  config.source = source;
  toml::table root;
  try {
    root = toml::parse(toml_text, std::string_view(source));
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.source().begin.line, ":",
                                                   e.source().begin.column, ": ",
                                                   std::string(e.description())));
  }
  absl::Status error;
  TableReader top(root, "", source, &error);
  if (const toml::node* server = top.Get("server")) {
    if (!server->is_table()) return top.Fail("server", "must be a table [server]", "");
    if (auto s = ParseServer(*server->as_table(), source, &config.server); !s.ok()) return s;
  }
  if (const toml::node* datasets = top.Get("datasets")) {
    if (!datasets->is_array_of_tables()) {
      return top.Fail("datasets", "must be an array of tables [[datasets]]", "");
    }
    const toml::array& arr = *datasets->as_array();
    for (size_t i = 0; i < arr.size(); ++i) {
      DatasetConfig d;
      std::string path = absl::StrCat("datasets[", i, "]");
      if (auto s = ParseDataset(*arr[i].as_table(), path, source, &d); !s.ok()) return s;
      if (config.FindDataset(d.name) != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", path, ".name: \"", d.name,
                                                       "\" is already used by another dataset"));
      }
      config.datasets.push_back(std::move(d));
    }
  }
  if (const toml::node* feeders = top.Get("feeders")) {
    if (!feeders->is_array_of_tables()) {
      return top.Fail("feeders", "must be an array of tables [[feeders]]", "");
    }
    const toml::array& arr = *feeders->as_array();
    for (size_t i = 0; i < arr.size(); ++i) {
      const std::string path = absl::StrCat("feeders[", i, "]");
      absl::Status feeder_error;
      TableReader r(*arr[i].as_table(), path, source, &feeder_error);
      FeederConfig f;
      r.String("address", &f.address, /*required=*/true);
      r.RejectUnknown();
      if (!feeder_error.ok()) return feeder_error;
      absl::Status valid = absl::StartsWith(f.address, "unix:")
                               ? absl::InvalidArgumentError("must be HOST:PORT (a feeder_listen)")
                               : ValidateListen(f.address);
      if (valid.ok() && std::find(config.feeders.begin(), config.feeders.end(), f) !=
                            config.feeders.end()) {
        valid = absl::InvalidArgumentError("is listed twice");
      }
      if (!valid.ok()) {
        return r.Fail("address", std::string(valid.message()), absl::StrCat("\"", f.address, "\""));
      }
      config.feeders.push_back(std::move(f));
    }
  }
  if (const toml::node* fp = top.Get("failpoints")) {
    if (!fp->is_table()) return top.Fail("failpoints", "must be a table [failpoints]", "");
    if (auto s = ParseFailpoints(*fp->as_table(), source, &config.failpoints); !s.ok()) return s;
  }
  if (const toml::node* tls = top.Get("tls")) {
    if (!tls->is_table()) return top.Fail("tls", "must be a table [tls]", "");
    if (auto s = ParseTls(*tls->as_table(), source, &config.tls); !s.ok()) return s;
  }
  top.RejectUnknown();
  if (!error.ok()) return error;
  if (absl::Status s = CheckTcpSecurity(config); !s.ok()) return s;
  // No [[datasets]] is a daemon that serves nothing yet (a package's shipped config): new ones
  // come with SIGHUP.
  return config;
}

bool IsTcpListen(std::string_view listen) {
  return listen.substr(0, 5) != "unix:";
}

absl::Status CheckTcpSecurity(const DaemonConfig& config) {
  const ServerConfig& s = config.server;
  if (!s.feeder_data_listen.empty() && !config.tls.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": server.feeder_data_listen: \"", s.feeder_data_listen,
        "\" needs [tls]: the data plane is mutual TLS only (server.insecure_tcp does not "
        "cover it). Add [tls] ca, cert and key, or leave feeder_data_listen out"));
  }
  if (config.tls.enabled() || s.insecure_tcp) return absl::OkStatus();
  if (!config.feeders.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": feeders[0].address: \"", config.feeders[0].address,
        "\" would be dialled without [tls]: anyone on the path could feed this host's trainers "
        "samples of their choosing. Add [tls] ca, cert and key (mutual TLS), or set "
        "server.insecure_tcp = true on a network you trust"));
  }
  if (!s.feeder_listen.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": server.feeder_listen: \"", s.feeder_listen,
        "\" is TCP without [tls]: any host that reaches the port could have this daemon decode "
        "for it. Add [tls] ca, cert and key (mutual TLS), or set server.insecure_tcp = true on a "
        "network you trust"));
  }
  if (!IsTcpListen(s.listen)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      config.source, ": server.listen: \"", s.listen,
      "\" is TCP without [tls]: anyone who reaches the port could read batches and call the "
      "daemon. Add [tls] ca, cert and key (mutual TLS), or set server.insecure_tcp = true on a "
      "network you trust"));
}

absl::StatusOr<DaemonConfig> LoadConfig(const std::string& path) {
  toml::table unused;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open config file: ",
                                            std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfig(ss.str(), path);
}

}  // namespace ringloader::server
