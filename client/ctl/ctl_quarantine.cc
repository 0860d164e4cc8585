// ringloaderctl quarantine list|clear.
#include <ostream>

#include "client/ctl/ctl.h"
#include "client/ctl/rpc.h"
#include "proto/ringloader.grpc.pb.h"

namespace ringloader::ctl {
namespace {

std::unique_ptr<v1::Loader::Stub> Stub(const std::string& endpoint, std::ostream& err,
                                       const char* what) {
  auto channel = ChannelFor(endpoint);
  if (!channel.ok()) {
    err << "ringloaderctl quarantine " << what << ": " << channel.status().message() << "\n";
    return nullptr;
  }
  return v1::Loader::NewStub(*channel);
}

}  // namespace

int RunQuarantineList(const QuarantineOptions& options, std::ostream& out, std::ostream& err) {
  auto stub = Stub(options.endpoint, err, "list");
  if (!stub) return kExitUsage;
  grpc::ClientContext context;
  SetTimeout(context, kRpcTimeout);
  v1::ListQuarantineResponse response;
  grpc::Status status = stub->ListQuarantine(&context, v1::ListQuarantineRequest(), &response);
  if (!status.ok()) {
    err << "ringloaderctl quarantine list: " << options.endpoint << ": " << Describe(status)
        << "\n";
    return ExitCodeFor(status);
  }
  if (response.samples_size() == 0) {
    out << "no quarantined samples\n";
    return kExitOk;
  }
  // dataset <TAB> sample_index <TAB> strikes <TAB> path (escaped as wire::EscapeBytes does)
  for (const v1::QuarantinedSample& q : response.samples()) {
    out << q.dataset() << "\t" << q.sample_index() << "\t" << q.strikes() << "\t"
        << q.path() << "\n";
  }
  return kExitOk;
}

int RunQuarantineClear(const QuarantineOptions& options, std::ostream& out, std::ostream& err) {
  auto stub = Stub(options.endpoint, err, "clear");
  if (!stub) return kExitUsage;
  grpc::ClientContext context;
  SetTimeout(context, kRpcTimeout);
  v1::ClearQuarantineRequest request;
  request.set_dataset(options.dataset);
  v1::ClearQuarantineResponse response;
  grpc::Status status = stub->ClearQuarantine(&context, request, &response);
  if (!status.ok()) {
    err << "ringloaderctl quarantine clear: " << options.endpoint << ": " << Describe(status)
        << "\n";
    return ExitCodeFor(status);
  }
  out << "cleared " << response.cleared() << " quarantined samples"
      << (options.dataset.empty() ? "" : " of " + options.dataset) << "\n";
  return kExitOk;
}

}  // namespace ringloader::ctl
