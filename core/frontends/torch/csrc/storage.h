// Growing a storage on the anychip device (resize_, storage.resize_): a new allocation and a
// device-to-device copy of what the old one held.
#pragma once

#include <c10/core/StorageImpl.h>

namespace anychip::torch_bridge {

void resize_bytes(c10::StorageImpl* storage, size_t nbytes);

}  // namespace anychip::torch_bridge
