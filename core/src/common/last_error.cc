#include "common/last_error.h"

#include <cstdio>
#include <cstring>

namespace anychip {

namespace {
thread_local char g_message[512] = "";
}

AnychipStatus fail(AnychipStatus status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(g_message, sizeof(g_message), fmt, args);
  va_end(args);
  return status;
}

AnychipStatus copy_last_error(char* buf, size_t len) {
  if (buf == nullptr || len == 0) return ANYCHIP_ERROR_INVALID_ARGUMENT;
  std::snprintf(buf, len, "%s", g_message);
  return ANYCHIP_OK;
}

}  // namespace anychip
