// SPDX-License-Identifier: Apache-2.0
#pragma once
// How byte strings from the wire or the filesystem are shown where text is needed (logs, stats,
// ringloaderctl output, the samples-out file). Sample paths are any bytes a filesystem allows and
// client names are whatever a client sends, so neither may reach a log or a terminal raw: a
// newline would forge a log line, an ANSI escape would rewrite the screen, and a Latin-1 byte is
// not UTF-8.
//
// EscapeBytes keeps printable ASCII and well-formed UTF-8 (without C0/C1 controls) as they are and
// writes everything else as C-style escapes: \\ for a backslash, \t \n \r, and \xNN for any other
// control byte or any byte that is not part of a valid UTF-8 sequence. The result is valid UTF-8,
// holds no control character, and is lossless: UnescapeBytes(EscapeBytes(s)) == s for every s.

#include <optional>
#include <string>
#include <string_view>

namespace ringloader::wire {

std::string EscapeBytes(std::string_view bytes);

// The inverse of EscapeBytes; nullopt for a malformed escape (a lone '\', "\x" without two hex
// digits, an unknown letter).
std::optional<std::string> UnescapeBytes(std::string_view text);

}  // namespace ringloader::wire
