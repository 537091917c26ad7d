// What the parts of the PyTorch bridge share: the one anychip device PyTorch's PrivateUse1
// backend ("anychip") stands for, loaded from its plugin by anychip_torch_open (device.cc).
//
// This folder and core/frontends/paddle/csrc/bridge are the only anychip sources that include a framework's
// headers. The bridge knows no chip: it drives whatever AnychipDeviceInterface it was given.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "anychip/device.h"

namespace anychip::torch_bridge {

extern AnychipDeviceInterface g_iface;  // the plugin's table; all NULL until anychip_torch_open
extern std::string g_name;              // the anychip device's name ("npu"), for messages
extern int g_device_count;

// Throws the plugin's last_error as a c10::Error naming `what` unless `status` is ANYCHIP_OK;
// ANYCHIP_ERROR_OUT_OF_MEMORY becomes c10::OutOfMemoryError (torch.OutOfMemoryError).
void check(AnychipStatus status, const char* what);
// Throws unless anychip_torch_open has loaded a device and `index` is one of its devices.
void check_device(c10::DeviceIndex index);

// The calling thread's current device (CUDA semantics: per thread, initially 0).
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);

}  // namespace anychip::torch_bridge

#define ANYCHIP_CALL(fn, ...) \
  ::anychip::torch_bridge::check(::anychip::torch_bridge::g_iface.fn(::anychip::torch_bridge::g_iface.runtime, __VA_ARGS__), #fn)
