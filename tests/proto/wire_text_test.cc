// SPDX-License-Identifier: Apache-2.0
// proto/wire_text: byte strings shown as text, losslessly.
#include "proto/wire_text.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>

namespace ringloader::wire {
namespace {

TEST_CASE("EscapeBytes: printable ASCII and UTF-8 stay, everything else is escaped", "[wire]") {
  CHECK(EscapeBytes("class_01/img 7.jpg") == "class_01/img 7.jpg");
  CHECK(EscapeBytes("caf\xc3\xa9/\xe6\x97\xa5.jpg") == "caf\xc3\xa9/\xe6\x97\xa5.jpg");  // UTF-8
  CHECK(EscapeBytes("caf\xe9.jpg") == "caf\\xe9.jpg");  // Latin-1, not UTF-8
  CHECK(EscapeBytes("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e");
  CHECK(EscapeBytes("\x1b[31mred\x7f") == "\\x1b[31mred\\x7f");
  CHECK(EscapeBytes(std::string("nul\0x", 5)) == "nul\\x00x");
  CHECK(EscapeBytes("\xc2\x85") == "\\xc2\\x85");          // U+0085, a C1 control
  CHECK(EscapeBytes("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // a UTF-16 surrogate
  CHECK(EscapeBytes("\xc0\xaf") == "\\xc0\\xaf");          // overlong '/'
  CHECK(EscapeBytes("\xe2\x82") == "\\xe2\\x82");          // cut short
}

TEST_CASE("UnescapeBytes: inverts EscapeBytes for any bytes, refuses malformed escapes",
          "[wire]") {
  std::mt19937 rng(7);
  for (int n = 0; n < 2000; ++n) {
    std::string bytes(rng() % 40, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const std::string text = EscapeBytes(bytes);
    for (char c : text) CHECK((static_cast<unsigned char>(c) >= 0x20 && c != 0x7f));
    CHECK(UnescapeBytes(text) == bytes);
  }
  for (const char* bad : {"\\", "a\\q", "\\x4", "\\xzz"}) {
    INFO(bad);
    CHECK_FALSE(UnescapeBytes(bad).has_value());
  }
}

}  // namespace
}  // namespace ringloader::wire
