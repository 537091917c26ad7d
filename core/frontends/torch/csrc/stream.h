// PyTorch streams on the anychip device: a c10::Stream's id indexes the device's stream table
// (id 0, the default stream, is created at first use); each thread has a current stream per device.
#pragma once

#include <c10/core/Stream.h>

#include "anychip/device.h"

namespace anychip::torch_bridge {

// The plugin's handle of `stream` (created on first use for the default stream).
AnychipStream stream_handle(const c10::Stream& stream);
// The calling thread's current stream on `device`, as a plugin handle.
AnychipStream current_stream_handle(c10::DeviceIndex device);

}  // namespace anychip::torch_bridge
