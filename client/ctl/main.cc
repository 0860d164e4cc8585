// SPDX-License-Identifier: Apache-2.0
// ringloaderctl: health, stats, consume, make-dataset, convert, validate and quarantine for
// ringloaderd.
#include "client/ctl/ctl.h"

int main(int argc, char** argv) { return ringloader::ctl::Main(argc, argv); }
