// SPDX-License-Identifier: Apache-2.0
// Issue 15 item 2: a C++ trainer builds against an installed ringloader, with CMake's
// find_package and with pkg-config, out of tree, and reads an epoch from a real daemon.
#include <catch2/catch.hpp>

#include <string>

#include "ringloader_version.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

TEST_CASE("15.2: a trainer built out of tree against the installed SDK reads an epoch, with "
          "find_package and with pkg-config", "[integration][sdk]") {
#ifdef RINGLOADER_SANITIZER_BUILD
  ReportSkip("the SDK of a sanitizer build needs the sanitizer's runtime in every trainer");
  return;
#endif
  TempDir dir;
  const std::string prefix = dir.Join("prefix");
  // The library (libringloader-client0's part) and the development files (-dev's).
  for (const char* component : {"client", "sdk"}) {
    const CommandResult installed =
        RunCommand({"/usr/bin/cmake", "--install", BuiltBinary(""), "--prefix", prefix,
                    "--component", component});
    INFO(installed.output);
    REQUIRE(installed.exit_code == 0);
  }

  DaemonFixtureOptions options;
  options.images = 40;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string source = std::string(RINGLOADER_SOURCE_DIR) + "/tests/integration/sdk_trainer";

  SECTION("find_package(ringloader CONFIG REQUIRED) and ringloader::client") {
    const CommandResult configured =
        RunCommand({"/usr/bin/cmake", "-S", source, "-B", dir.Join("build"), "-G", "Ninja",
                    "-DCMAKE_PREFIX_PATH=" + prefix, "-DCMAKE_CXX_COMPILER=/usr/bin/c++"});
    INFO(configured.output);
    REQUIRE(configured.exit_code == 0);
    const CommandResult built = RunCommand({"/usr/bin/cmake", "--build", dir.Join("build")});
    INFO(built.output);
    REQUIRE(built.exit_code == 0);
    // The build tree's RPATH finds the library in the prefix.
    const CommandResult ran =
        RunCommand({dir.Join("build/trainer"), daemon.endpoint(), "synth"});
    INFO(ran.output);
    CHECK(ran.exit_code == 0);
    CHECK_THAT(ran.output, Catch::Contains("read 40 samples"));
  }
  SECTION("pkg-config ringloader-client") {
    const std::string libdir = prefix + "/lib";
    const CommandResult flags = RunCommand(
        {"/usr/bin/pkg-config", "--cflags", "--libs", "ringloader-client"},
        {{"PKG_CONFIG_PATH", libdir + "/pkgconfig"}});
    INFO(flags.output);
    REQUIRE(flags.exit_code == 0);
    std::vector<std::string> argv = {"/usr/bin/c++", source + "/trainer.cc", "-o",
                                     dir.Join("trainer")};
    std::string word;
    for (char c : flags.output + " ") {
      if (c == ' ' || c == '\n') {
        if (!word.empty()) argv.push_back(word);
        word.clear();
      } else {
        word += c;
      }
    }
    const CommandResult built = RunCommand(argv);
    INFO(built.output);
    REQUIRE(built.exit_code == 0);
    const CommandResult ran = RunCommand({dir.Join("trainer"), daemon.endpoint(), "synth"},
                                         {{"LD_LIBRARY_PATH", libdir}});
    INFO(ran.output);
    CHECK(ran.exit_code == 0);
    CHECK_THAT(ran.output, Catch::Contains("sdk " RINGLOADER_VERSION " read 40 samples"));
  }
}

}  // namespace
}  // namespace ringloader::testing
