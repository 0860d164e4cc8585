# SPDX-License-Identifier: Apache-2.0
"""libringloader-client.so exports the client API and nothing else (issue 31 item 2), under a
SONAME that changes with every minor version before 1.0 (issue 37 item 5).

Its gRPC, protobuf and abseil code is private: were any of their symbols exported, a trainer
linking its own copies (another protobuf, a vendored abseil) would bind some calls to ours.
Before 1.0 a minor version may change client.h's structs, so a trainer built against 0.1 must
never load 0.2's library: SONAME libringloader-client.so.0.1 for libringloader-client.so.0.1.z.
Usage: exports_test.py LIBRARY (the real file, libringloader-client.so.X.Y.Z)
"""
import os
import re
import subprocess
import sys


def dynamic_symbols(library):
    out = subprocess.run(["nm", "-D", "--defined-only", "--demangle", library],
                         check=True, capture_output=True, text=True).stdout
    # "<address> <type> <name>"; the names may hold spaces ("typeinfo for ...").
    return [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]


def soname(library):
    out = subprocess.run(["readelf", "-d", library], check=True, capture_output=True,
                         text=True).stdout
    found = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return found.group(1) if found else None


def check_soname(library):
    """The SONAME the version policy wants: .so.0.Y before 1.0, .so.X from 1.0 on."""
    version = re.fullmatch(r"libringloader-client\.so\.(\d+)\.(\d+)\.(\d+)",
                           os.path.basename(os.path.realpath(library)))
    if not version:
        print(f"{library}: not a versioned file libringloader-client.so.X.Y.Z")
        return False
    major, minor = version.group(1), version.group(2)
    wanted = f"libringloader-client.so.{major}" + (f".{minor}" if major == "0" else "")
    actual = soname(library)
    if actual != wanted:
        print(f"{library}: SONAME {actual}, want {wanted} (before 1.0 every minor version is a "
              "new ABI)")
        return False
    print(f"{library}: SONAME {actual}")
    return True


def main():
    library = sys.argv[1]
    if not check_soname(library):
        return 1
    symbols = dynamic_symbols(library)
    # The API's functions, and its exception's typeinfo and vtable (caught in trainers).
    allowed = ("ringloader::client::", "typeinfo for ringloader::client::",
               "typeinfo name for ringloader::client::", "vtable for ringloader::client::")
    foreign = [s for s in symbols if not s.startswith(allowed)]
    if foreign:
        print(f"{library} exports {len(foreign)} symbols outside ringloader::client, e.g.:")
        print("\n".join(foreign[:20]))
        return 1
    for wanted in ("ringloader::client::Client::Open(", "ringloader::client::Version()",
                   "ringloader::client::Stream::Next()", "typeinfo for ringloader::client::Error",
                   "ringloader::client::ContinueState("):
        if not any(s.startswith(wanted) for s in symbols):
            print(f"{library} does not export {wanted}...; it exports:\n" + "\n".join(symbols))
            return 1
    for private in ("google::protobuf", "grpc", "absl::", "ringloader::v1", "ringloader::shm"):
        if any(private in s for s in symbols):
            print(f"{library} exports {private} symbols")
            return 1
    print(f"{library}: {len(symbols)} symbols, all ringloader::client")
    return 0


if __name__ == "__main__":
    sys.exit(main())
