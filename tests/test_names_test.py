#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every Catch2 TEST_CASE name can be one CTest test: catch_discover_tests splits a name at ';'
(a CMake list separator) into bogus tests that run nothing and pass. Fails naming each such case."""

import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
bad = []
for path in sorted(root.rglob("*.cc")):
    text = path.read_text(errors="replace")
    for m in re.finditer(r'TEST_CASE\(((?:\s*"(?:[^"\\]|\\.)*")+)', text):
        name = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
        if ";" in name:
            bad.append(f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {name}")
if bad:
    print("TEST_CASE names with ';' (CTest splits them):\n" + "\n".join(bad))
    sys.exit(1)
print("ok")
