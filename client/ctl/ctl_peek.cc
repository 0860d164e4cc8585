// SPDX-License-Identifier: Apache-2.0
// ringloaderctl peek: one batch, exactly as a trainer with those options receives it, as a
// contact sheet and its legend.
#include <filesystem>
#include <fstream>
#include <ostream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/ctl/consume_state.h"
#include "client/ctl/contact_sheet.h"
#include "client/ctl/ctl.h"
#include "proto/wire_text.h"

namespace ringloader::ctl {

std::string LegendPath(const std::string& sheet_path) {
  return std::filesystem::path(sheet_path).replace_extension(".tsv").string();
}

int RunPeek(const PeekOptions& o, std::ostream& out, std::ostream& err) {
  const auto fail = [&](absl::string_view message, int code) {
    err << "ringloaderctl peek: " << message << "\n";
    return code;
  };
  const std::string lower = absl::AsciiStrToLower(o.out);
  if (!absl::EndsWith(lower, ".png") && !absl::EndsWith(lower, ".jpg") &&
      !absl::EndsWith(lower, ".jpeg")) {
    return fail(absl::StrCat("--out ", o.out, ": must end in .png (lossless: the bytes a trainer "
                             "gets) or .jpg"),
                kExitUsage);
  }
  const uint32_t image_size = o.stream.image_size;
  if (o.columns == 0 || o.stream.batch_size == 0 || image_size == 0) {
    return fail("--columns, --batch-size and --image-size must be > 0", kExitUsage);
  }
  ConsumeOptions as_consume = o.stream;  // the same flags mean the same stream
  as_consume.dtype = "uint8";            // the bytes before any float32 normalisation, NHWC
  as_consume.drop_last = false;
  as_consume.epochs = o.epoch + 1;
  as_consume.reconnect_deadline_s = 10;
  absl::StatusOr<client::StreamOptions> s = ToStreamOptions(as_consume);
  if (!s.ok()) return fail(s.status().message(), kExitUsage);
  // From the epoch's first batch: a batch's samples depend on which files before it were bad.
  s->start = client::Position{o.epoch, 0, 0};
  s->client_name = "ringloaderctl peek";
  try {
    client::Client client(o.endpoint);
    std::unique_ptr<client::Stream> stream = client.Open(*s);
    std::optional<client::Batch> batch;
    for (uint64_t b = 0; b <= o.batch; ++b) {
      batch = stream->Next();
      if (!batch) {
        return fail(absl::StrCat("epoch ", o.epoch, " has ", b, " batches: there is no batch ",
                                 o.batch),
                    kExitUsage);
      }
    }
    const uint32_t n = batch->size();
    const ContactSheet sheet =
        ComposeSheet(batch->images().data<uint8_t>(), n, image_size, o.columns);
    if (absl::Status w = WriteSheet(sheet, o.out); !w.ok()) return fail(w.message(), kExitFailure);
    const std::string legend_path = LegendPath(o.out);
    std::ofstream legend(legend_path, std::ios::trunc);
    legend << "tile\tsample_index\tlabel\tpath\n";
    for (uint32_t k = 0; k < n; ++k) {
      legend << k << "\t" << batch->indices().data<int64_t>()[k] << "\t"
             << batch->labels().data<int64_t>()[k] << "\t"
             << wire::EscapeBytes(batch->relative_path(k)) << "\n";
    }
    legend.close();
    if (!legend) return fail(absl::StrCat("cannot write ", legend_path), kExitFailure);
    out << "wrote " << o.out << " (" << n << " tiles of " << image_size << " px, "
        << sheet.width / image_size << " per row: batch " << o.batch << " of epoch " << o.epoch
        << ") and " << legend_path << "\n";
  } catch (const client::Error& e) {
    return fail(e.what(),
                e.code() == client::ErrorCode::kUnavailable ? kExitUnavailable : kExitFailure);
  }
  return kExitOk;
}

}  // namespace ringloader::ctl
