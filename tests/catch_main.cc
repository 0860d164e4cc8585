// SPDX-License-Identifier: Apache-2.0
// The one translation unit that compiles Catch2's main (slow to build, so built once).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
