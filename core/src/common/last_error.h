// Thread-local "last error" message shared by anychip's C++ runtimes (see device.h conventions).
#pragma once

#include <cstdarg>
#include <cstddef>

#include "anychip/device.h"

namespace anychip {

// Records a printf-style message for this thread and returns `status`, so failures read
// `return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "...", ...);`.
AnychipStatus fail(AnychipStatus status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Copies this thread's message into buf (NUL-terminated, truncated).
AnychipStatus copy_last_error(char* buf, size_t len);

}  // namespace anychip
