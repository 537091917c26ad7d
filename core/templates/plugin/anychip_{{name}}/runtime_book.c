/* anychip's runtime book (anychip/runtime_book.h: the runtime contract's bookkeeping), compiled
 * into lib{{name}}_runtime.so. Its source ships beside the header; there is nothing to port here. */
#include "anychip/runtime_book.c"
