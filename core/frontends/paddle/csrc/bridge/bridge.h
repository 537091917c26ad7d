// What the two halves of the Paddle bridge share: the device's function table, loaded by
// bridge.cc (the runtime functions), and used by collectives.cc (Paddle's xccl_* functions).
#pragma once

#include <string>

#include "anychip/device.h"
#include "paddle/phi/backends/device_ext.h"

namespace anychip::bridge {

extern AnychipDeviceInterface g_iface;  // the plugin's table, filled once by InitPlugin
extern std::string g_name;              // the anychip device's name, for messages

// C_SUCCESS for ANYCHIP_OK; otherwise prints the plugin's last_error, naming `what`, and returns
// the C_Status Paddle expects for `status`.
C_Status report(AnychipStatus status, const char* what);
// Prints why the bridge refuses a call that never reached the plugin; returns C_ERROR.
C_Status refuse(const char* what, const std::string& why);

#define CALL(fn, ...) report(g_iface.fn(g_iface.runtime, __VA_ARGS__), #fn)
#define CALL0(fn) report(g_iface.fn(g_iface.runtime), #fn)

inline AnychipStream S(C_Stream s) { return reinterpret_cast<AnychipStream>(s); }
inline AnychipEvent E(C_Event e) { return reinterpret_cast<AnychipEvent>(e); }

// Fills Paddle's xccl_* functions when the plugin has collectives (device ABI >= 1.2); leaves
// them NULL otherwise, so Paddle says the device has none.
void fill_collectives(C_DeviceInterface* p);

}  // namespace anychip::bridge
