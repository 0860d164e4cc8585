// SPDX-License-Identifier: Apache-2.0
// The SDK's version (client.h: Version()), fixed when the shared library is built.
#include "client/client.h"
#include "ringloader_version.h"

namespace ringloader::client {

const char* Version() { return RINGLOADER_VERSION; }

}  // namespace ringloader::client
