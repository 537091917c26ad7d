#include "common/last_error.h"

#include "anychip/runtime_book.h"

namespace anychip {

// The message lives in the runtime book (anychip/runtime_book.h), which every runtime shares.
AnychipStatus fail(AnychipStatus status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  anychip_book_vfail(status, fmt, args);
  va_end(args);
  return status;
}

AnychipStatus copy_last_error(char* buf, size_t len) { return anychip_book_last_error(buf, len); }

}  // namespace anychip
