// Issue 4: a bad config fails at start with the file, the key path and what is wrong.
#include <catch2/catch.hpp>

#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

CommandResult StartWith(const TempDir& dir, const std::string& toml) {
  WriteFile(dir.Join("bad.toml"), toml);
  return RunCommand({DaemonPath(), "--config", dir.Join("bad.toml")}, {},
                    std::chrono::seconds(30));
}

std::string Header(const TempDir& dir) {
  return "[server]\nlisten = \"unix:" + dir.Join("s.sock") + "\"\nstate_dir = \"" +
         dir.Join("state") + "\"\n";
}

}  // namespace

TEST_CASE("ringloaderd: an unknown key names the file and key path", "[integration][config]") {
  TempDir dir;
  CommandResult r = StartWith(dir, Header(dir) + "decode_thread = 4\n[[datasets]]\nname = \"a\"\n"
                                   "format = \"imagefolder\"\npath = \"/tmp\"\n");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("bad.toml: server.decode_thread: unknown key"));
}

TEST_CASE("ringloaderd: a wrong type names the key and the value", "[integration][config]") {
  TempDir dir;
  CommandResult r = StartWith(dir, Header(dir) + "[[datasets]]\nname = \"a\"\nformat = "
                                   "\"imagefolder\"\npath = \"/tmp\"\nmax_pixels = \"big\"\n");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output,
             Catch::Contains("bad.toml: datasets[0].max_pixels: must be an integer (got \"big\")"));
}

TEST_CASE("ringloaderd: a missing or absent dataset path is an error", "[integration][config]") {
  TempDir dir;
  CommandResult missing_key = StartWith(
      dir, Header(dir) + "[[datasets]]\nname = \"a\"\nformat = \"imagefolder\"\n");
  CHECK(missing_key.exit_code == 1);
  CHECK_THAT(missing_key.output, Catch::Contains("bad.toml: datasets[0].path: is required"));

  CommandResult absent = StartWith(dir, Header(dir) + "[[datasets]]\nname = \"a\"\nformat = "
                                        "\"imagefolder\"\npath = \"/nonexistent/images\"\n");
  CHECK(absent.exit_code == 1);
  CHECK_THAT(absent.output, Catch::Contains("datasets[0].path: \"/nonexistent/images\" is not a "
                                            "directory"));
}

TEST_CASE("ringloaderd: a TOML syntax error names the line", "[integration][config]") {
  TempDir dir;
  CommandResult r = StartWith(dir, Header(dir) + "ring_slots = = 3\n");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("bad.toml:4:"));
}

TEST_CASE("ringloaderd: a missing config file is named", "[integration][config]") {
  CommandResult r = RunCommand({DaemonPath(), "--config", "/nonexistent/ringloaderd.toml"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("/nonexistent/ringloaderd.toml: cannot open config file"));
}

TEST_CASE("the shipped config/ringloaderd.toml parses once its dataset path exists",
          "[integration][config]") {
  TempDir dir;
  std::string shipped = ReadFile(std::string(RINGLOADER_SOURCE_DIR) + "/config/ringloaderd.toml");
  REQUIRE(!shipped.empty());
  // Point the socket, state and dataset at the temp dir; everything else as shipped.
  auto replace = [&](const std::string& from, const std::string& to) {
    size_t at = shipped.find(from);
    REQUIRE(at != std::string::npos);
    shipped.replace(at, from.size(), to);
  };
  replace("unix:/run/ringloader/ringloader.sock", "unix:" + dir.Join("s.sock"));
  replace("\"/var/lib/ringloader\"", "\"" + dir.Join("state") + "\"");
  replace("\"/srv/datasets/demo\"", "\"" + dir.path() + "\"");
  WriteFile(dir.Join("data.jpg"), "");  // an imagefolder with no class folders: no images
  CommandResult r = StartWith(dir, shipped);
  // It gets past config parsing to opening the (empty) dataset.
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, !Catch::Contains("unknown key") && !Catch::Contains("must be"));
  CHECK_THAT(r.output, Catch::Contains("datasets[0]"));
}

}  // namespace ringloader::testing
