// SPDX-License-Identifier: Apache-2.0
#include "client/retry.h"

#include <catch2/catch.hpp>

#include "client/channel.h"

namespace ringloader::client {
namespace {

using grpc::StatusCode;

TEST_CASE("Classify: transport failures are reopened for every RPC", "[client][retry]") {
  for (StatusCode code :
       {StatusCode::UNAVAILABLE, StatusCode::CANCELLED, StatusCode::DEADLINE_EXCEEDED,
        StatusCode::ABORTED, StatusCode::UNKNOWN}) {
    CAPTURE(code);
    CHECK(Classify(code, "", RpcKind::kOpenStream) == Recovery::kReopen);
    CHECK(Classify(code, "", RpcKind::kStreamCall) == Recovery::kReopen);
  }
  CHECK(Classify(StatusCode::INTERNAL, "Received RST_STREAM with error code 2",
                 RpcKind::kStreamCall) == Recovery::kReopen);
  CHECK(Classify(StatusCode::INTERNAL, "stream manager bug", RpcKind::kStreamCall) ==
        Recovery::kFail);
}

TEST_CASE("Classify: a stale stream or incarnation is reopened, an unknown dataset is not",
          "[client][retry]") {
  CHECK(Classify(StatusCode::NOT_FOUND, "unknown stream 7", RpcKind::kStreamCall) ==
        Recovery::kReopen);
  CHECK(Classify(StatusCode::FAILED_PRECONDITION, "stale incarnation", RpcKind::kStreamCall) ==
        Recovery::kReopen);
  CHECK(Classify(StatusCode::NOT_FOUND, "unknown dataset 'x'", RpcKind::kOpenStream) ==
        Recovery::kFail);
  CHECK(Classify(StatusCode::FAILED_PRECONDITION, "", RpcKind::kOpenStream) == Recovery::kFail);
}

TEST_CASE("Classify: request errors fail at once", "[client][retry]") {
  for (StatusCode code :
       {StatusCode::INVALID_ARGUMENT, StatusCode::RESOURCE_EXHAUSTED, StatusCode::DATA_LOSS,
        StatusCode::PERMISSION_DENIED, StatusCode::OUT_OF_RANGE, StatusCode::UNIMPLEMENTED}) {
    CAPTURE(code);
    CHECK(Classify(code, "", RpcKind::kOpenStream) == Recovery::kFail);
    CHECK(Classify(code, "", RpcKind::kStreamCall) == Recovery::kFail);
  }
}

TEST_CASE("ToErrorCode: maps the documented codes", "[client][retry]") {
  CHECK(ToErrorCode(StatusCode::NOT_FOUND) == ErrorCode::kNotFound);
  CHECK(ToErrorCode(StatusCode::INVALID_ARGUMENT) == ErrorCode::kInvalidArgument);
  CHECK(ToErrorCode(StatusCode::RESOURCE_EXHAUSTED) == ErrorCode::kResourceExhausted);
  CHECK(ToErrorCode(StatusCode::DATA_LOSS) == ErrorCode::kDataLoss);
  CHECK(ToErrorCode(StatusCode::FAILED_PRECONDITION) == ErrorCode::kFailedPrecondition);
  CHECK(ToErrorCode(StatusCode::UNAVAILABLE) == ErrorCode::kUnavailable);
  CHECK(ToErrorCode(StatusCode::INTERNAL) == ErrorCode::kInternal);
  CHECK(DescribeStatus(grpc::Status(StatusCode::UNAVAILABLE, "connect failed")) ==
        "UNAVAILABLE: connect failed");
}

TEST_CASE("Backoff: doubles from 5 ms, caps at 250 ms, jitters within [50%, 100%]",
          "[client][retry]") {
  Backoff backoff(/*seed=*/42);
  int64_t nominal = 5'000;
  for (int attempt = 0; attempt < 30; ++attempt) {
    const int64_t delay = backoff.NextDelay().count();
    CAPTURE(attempt, delay, nominal);
    CHECK(delay >= nominal / 2);
    CHECK(delay <= nominal);
    nominal = std::min<int64_t>(nominal * 2, 250'000);
  }
  backoff.Reset();
  CHECK(backoff.NextDelay().count() <= 5'000);

  Backoff a(7), b(7);
  for (int i = 0; i < 10; ++i) CHECK(a.NextDelay() == b.NextDelay());
}

TEST_CASE("GrpcTarget: accepts the documented endpoint forms", "[client][endpoint]") {
  CHECK(GrpcTarget("unix:/run/ringloader/ringloader.sock").value() ==
        "unix:/run/ringloader/ringloader.sock");
  CHECK(GrpcTarget("unix:///tmp/a.sock").value() == "unix:/tmp/a.sock");
  CHECK(GrpcTarget("unix:rel/a.sock").value() == "unix:rel/a.sock");
  CHECK(GrpcTarget("/tmp/a.sock").value() == "unix:/tmp/a.sock");
  CHECK(GrpcTarget("localhost:7077").value() == "localhost:7077");
  CHECK(GrpcTarget("127.0.0.1:1").value() == "127.0.0.1:1");
  CHECK(GrpcTarget("[::1]:65535").value() == "[::1]:65535");
}

TEST_CASE("GrpcTarget: rejects malformed endpoints naming them", "[client][endpoint]") {
  for (const char* bad :
       {"", "unix:", "unix://", "unix://host/a.sock", "localhost", "localhost:", "localhost:0",
        "localhost:65536", "localhost:http", ":80", "::1:80", "[::1:80"}) {
    CAPTURE(bad);
    auto target = GrpcTarget(bad);
    REQUIRE_FALSE(target.ok());
    CHECK(target.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(target.status().message()),
               Catch::Contains(std::string("'") + bad + "'"));
  }
}

TEST_CASE("Client: a malformed endpoint is an InvalidArgument Error", "[client][endpoint]") {
  try {
    Client client("no-port-here");
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("no-port-here"));
  }
}

}  // namespace
}  // namespace ringloader::client
