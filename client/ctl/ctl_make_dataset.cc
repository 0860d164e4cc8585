// ringloaderctl make-dataset: a synthetic imagefolder dataset for demos and tests.
#include <ostream>

#include "client/ctl/ctl.h"
#include "server/image/synthetic.h"

namespace ringloader::ctl {

int RunMakeDataset(const MakeDatasetOptions& options, std::ostream& out, std::ostream& err) {
  if (options.out_dir.empty() || options.count == 0 || options.classes == 0) {
    err << "ringloaderctl make-dataset: --out must be set and --count, --classes must be > 0\n";
    return kExitUsage;
  }
  image::SyntheticDatasetOptions synthetic;
  synthetic.out_dir = options.out_dir;
  synthetic.count = options.count;
  synthetic.classes = options.classes;
  synthetic.seed = options.seed;
  absl::StatusOr<uint32_t> written = image::WriteSyntheticDataset(synthetic);
  if (!written.ok()) {
    err << "ringloaderctl make-dataset: " << written.status().message() << "\n";
    return kExitFailure;
  }
  out << "wrote " << *written << " images in " << options.classes << " classes to "
      << options.out_dir << "\n";
  return kExitOk;
}

}  // namespace ringloader::ctl
