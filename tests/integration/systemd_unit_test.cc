// Issue 4: the shipped unit passes `systemd-analyze verify` (when the tool is present).
#include <catch2/catch.hpp>
#include <unistd.h>

#include <string>

#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {

TEST_CASE("systemd: ringloaderd.service passes systemd-analyze verify", "[integration][systemd]") {
  if (::access("/usr/bin/systemd-analyze", X_OK) != 0) {
    RINGLOADER_SKIP("systemd-analyze not installed");
  }
  // The unit generated for the install prefix names the installed binary, which a build tree
  // does not have: point ExecStart at the built one, keep every other line as shipped.
  std::string unit = ReadFile(BuiltBinary("systemd/ringloaderd.service"));
  REQUIRE(!unit.empty());
  CHECK_THAT(unit, Catch::Contains("Restart=always") && Catch::Contains("RuntimeDirectory=") &&
                       Catch::Contains("StateDirectory=") && Catch::Contains("MemoryMax="));
  const size_t exec_start = unit.find("ExecStart=");
  REQUIRE(exec_start != std::string::npos);
  const size_t line_end = unit.find('\n', exec_start);
  unit.replace(exec_start, line_end - exec_start,
               "ExecStart=" + DaemonPath() + " --config " + std::string(RINGLOADER_SOURCE_DIR) +
                   "/config/ringloaderd.toml");
  TempDir dir;
  WriteFile(dir.Join("ringloaderd.service"), unit);
  CommandResult r = RunCommand({"/usr/bin/systemd-analyze", "verify", dir.Join("ringloaderd.service")});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  // Unknown or misplaced keys are only warnings: none allowed.
  CHECK_THAT(r.output, !Catch::Contains("ringloaderd.service:"));
}

}  // namespace ringloader::testing
