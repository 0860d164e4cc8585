"""libringloader-client.so exports the client API and nothing else (issue 31 item 2).

Its gRPC, protobuf and abseil code is private: were any of their symbols exported, a trainer
linking its own copies (another protobuf, a vendored abseil) would bind some calls to ours.
Usage: exports_test.py LIBRARY
"""
import subprocess
import sys


def dynamic_symbols(library):
    out = subprocess.run(["nm", "-D", "--defined-only", "--demangle", library],
                         check=True, capture_output=True, text=True).stdout
    # "<address> <type> <name>"; the names may hold spaces ("typeinfo for ...").
    return [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]


def main():
    library = sys.argv[1]
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
