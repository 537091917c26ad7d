// Paddle's collectives (device_ext.h's xccl_* functions, called by ProcessGroupCustom and the
// xccl comm context) routed to the device's own (device.h, ABI 1.2).
//
// Paddle's calls name no device: a communicator is made on the device Paddle made current
// (paddle.distributed sets it before it initialises the communicator), so the bridge's
// communicator remembers that device, for the copies all_to_all may need. Paddle's element
// types and reduction operators are translated here; one the device does not have is refused
// before anything is enqueued, with a message naming it.
#include <cstdio>
#include <string>
#include <vector>

#include "bridge.h"

namespace anychip::bridge {
namespace {

struct Comm {
  AnychipComm comm;
  int device;
  size_t rank;
  size_t nranks;
};

Comm* C(C_CCLComm comm) { return reinterpret_cast<Comm*>(comm); }

// Paddle's C_DataType as an AnychipDtype, and its bytes; false for types anychip has not.
bool dtype_of(C_DataType type, AnychipDtype* out, size_t* bytes) {
  switch (type) {
    case BOOL: *out = ANYCHIP_DTYPE_BOOL; *bytes = 1; return true;
    case UINT8: *out = ANYCHIP_DTYPE_UINT8; *bytes = 1; return true;
    case INT8: *out = ANYCHIP_DTYPE_INT8; *bytes = 1; return true;
    case INT16: *out = ANYCHIP_DTYPE_INT16; *bytes = 2; return true;
    case INT32: *out = ANYCHIP_DTYPE_INT32; *bytes = 4; return true;
    case INT64: *out = ANYCHIP_DTYPE_INT64; *bytes = 8; return true;
    case FLOAT16: *out = ANYCHIP_DTYPE_FLOAT16; *bytes = 2; return true;
    case BFLOAT16: *out = ANYCHIP_DTYPE_BFLOAT16; *bytes = 2; return true;
    case FLOAT32: *out = ANYCHIP_DTYPE_FLOAT32; *bytes = 4; return true;
    case FLOAT64: *out = ANYCHIP_DTYPE_FLOAT64; *bytes = 8; return true;
    default: return false;
  }
}

bool op_of(C_CCLReduceOp op, AnychipReduceOp* out) {
  switch (op) {
    case SUM: *out = ANYCHIP_REDUCE_SUM; return true;
    case AVG: *out = ANYCHIP_REDUCE_AVG; return true;
    case MAX: *out = ANYCHIP_REDUCE_MAX; return true;
    case MIN: *out = ANYCHIP_REDUCE_MIN; return true;
    case PRODUCT: *out = ANYCHIP_REDUCE_PROD; return true;
    default: return false;
  }
}

// The AnychipDtype of `type` in `*out`, or a refusal of `what` naming the type.
#define DTYPE(type, what)                                                                        \
  AnychipDtype dt;                                                                               \
  size_t dt_bytes;                                                                               \
  if (!dtype_of(type, &dt, &dt_bytes))                                                           \
    return refuse(what, "data_type " + std::to_string(static_cast<int>(type)) +                  \
                            " (Paddle's C_DataType) has no anychip dtype; anychip's collectives " \
                            "take bool, uint8, int8, int16, int32, int64, float16, bfloat16, "    \
                            "float32 and float64");                                              \
  (void)dt_bytes
#define OP(op, what)                                                                     \
  AnychipReduceOp rop;                                                                   \
  if (!op_of(op, &rop))                                                                  \
    return refuse(what, "reduce op " + std::to_string(static_cast<int>(op)) +            \
                            " (Paddle's C_CCLReduceOp) is not sum, avg, max, min or product")

C_Status get_comm_name(C_CCLComm comm, char* name) {
  // Paddle passes no buffer size: stay far below any it uses (NCCL's are 128 bytes).
  std::snprintf(name, 32, "anychip-%d-r%zu/%zu", C(comm)->device, C(comm)->rank, C(comm)->nranks);
  return C_SUCCESS;
}

C_Status get_unique_id_size(size_t* size) { return CALL(comm_get_unique_id_size, size); }

C_Status get_unique_id(C_CCLRootId* id) { return CALL(comm_get_unique_id, id->data, id->sz); }

C_Status comm_init_rank(size_t nranks, C_CCLRootId* id, size_t rank, C_CCLComm* out) {
  int device = 0;
  if (C_Status s = CALL(get_device, &device)) return s;
  AnychipComm comm = nullptr;
  if (C_Status s = CALL(comm_init_rank, device, id->data, id->sz, static_cast<int>(rank),
                        static_cast<int>(nranks), &comm)) {
    return s;
  }
  *out = reinterpret_cast<C_CCLComm>(new Comm{comm, device, rank, nranks});
  return C_SUCCESS;
}

C_Status destroy_comm(C_CCLComm comm) {
  C_Status s = CALL(comm_destroy, C(comm)->comm);
  delete C(comm);
  return s;
}

C_Status all_reduce(void* send, void* recv, size_t count, C_DataType type, C_CCLReduceOp op,
                    C_CCLComm comm, C_Stream stream) {
  DTYPE(type, "xccl_all_reduce");
  OP(op, "xccl_all_reduce");
  return CALL(all_reduce, send, recv, count, dt, rop, C(comm)->comm, S(stream));
}

C_Status broadcast(void* buf, size_t count, C_DataType type, size_t root, C_CCLComm comm,
                   C_Stream stream) {
  DTYPE(type, "xccl_broadcast");
  return CALL(broadcast, buf, buf, count, dt, static_cast<int>(root), C(comm)->comm, S(stream));
}

C_Status reduce(void* send, void* recv, size_t count, C_DataType type, C_CCLReduceOp op,
                size_t root, C_CCLComm comm, C_Stream stream) {
  DTYPE(type, "xccl_reduce");
  OP(op, "xccl_reduce");
  return CALL(reduce, send, recv, count, dt, rop, static_cast<int>(root), C(comm)->comm, S(stream));
}

C_Status all_gather(void* send, void* recv, size_t count, C_DataType type, C_CCLComm comm,
                    C_Stream stream) {
  DTYPE(type, "xccl_all_gather");
  return CALL(all_gather, send, recv, count, dt, C(comm)->comm, S(stream));
}

C_Status reduce_scatter(void* send, void* recv, size_t count, C_DataType type, C_CCLReduceOp op,
                        C_CCLComm comm, C_Stream stream) {
  DTYPE(type, "xccl_reduce_scatter");
  OP(op, "xccl_reduce_scatter");
  return CALL(reduce_scatter, send, recv, count, dt, rop, C(comm)->comm, S(stream));
}

C_Status group_start() { return CALL0(group_start); }
C_Status group_end() { return CALL0(group_end); }

C_Status send(void* buf, size_t count, C_DataType type, size_t peer, C_CCLComm comm,
              C_Stream stream) {
  DTYPE(type, "xccl_send");
  return CALL(send, buf, count, dt, static_cast<int>(peer), C(comm)->comm, S(stream));
}

C_Status recv(void* buf, size_t count, C_DataType type, size_t peer, C_CCLComm comm,
              C_Stream stream) {
  DTYPE(type, "xccl_recv");
  return CALL(recv, buf, count, dt, static_cast<int>(peer), C(comm)->comm, S(stream));
}

// Paddle's all_to_all takes one buffer, count and type per peer. The device's all_to_all moves
// equal slices of one contiguous buffer; anything else is a group of sends and receives, and
// the rank's own slice a device copy, all in the stream's order.
C_Status all_to_all(const void** send_buf, const size_t* send_count, const C_DataType* send_type,
                    void** recv_buf, const size_t* recv_count, const C_DataType* recv_type,
                    size_t rank, size_t nranks, C_CCLComm comm, C_Stream stream) {
  Comm* c = C(comm);
  if (nranks != c->nranks || rank != c->rank) {
    return refuse("xccl_all_to_all", "rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                                         " does not match the communicator's rank " +
                                         std::to_string(c->rank) + " of " + std::to_string(c->nranks));
  }
  std::vector<AnychipDtype> send_dt(nranks), recv_dt(nranks);
  std::vector<size_t> send_bytes(nranks), recv_bytes(nranks);
  for (size_t i = 0; i < nranks; ++i) {
    if (!dtype_of(send_type[i], &send_dt[i], &send_bytes[i]) ||
        !dtype_of(recv_type[i], &recv_dt[i], &recv_bytes[i])) {
      return refuse("xccl_all_to_all", "a data_type of peer " + std::to_string(i) + " has no anychip dtype");
    }
  }
  const size_t count = send_count[0];
  bool uniform = true;
  for (size_t i = 0; i < nranks && uniform; ++i) {
    uniform = send_count[i] == count && recv_count[i] == count && send_dt[i] == send_dt[0] &&
              recv_dt[i] == send_dt[0] &&
              static_cast<const char*>(send_buf[i]) == static_cast<const char*>(send_buf[0]) + i * count * send_bytes[0] &&
              static_cast<char*>(recv_buf[i]) == static_cast<char*>(recv_buf[0]) + i * count * send_bytes[0];
  }
  if (uniform) return CALL(all_to_all, send_buf[0], recv_buf[0], count, send_dt[0], c->comm, S(stream));
  if (send_count[rank] * send_bytes[rank] != recv_count[rank] * recv_bytes[rank]) {
    return refuse("xccl_all_to_all", "this rank's own slice has " + std::to_string(send_count[rank] * send_bytes[rank]) +
                                         " bytes to send and " + std::to_string(recv_count[rank] * recv_bytes[rank]) +
                                         " to receive");
  }
  if (C_Status s = CALL0(group_start)) return s;
  C_Status status = C_SUCCESS;
  for (size_t i = 0; i < nranks && status == C_SUCCESS; ++i) {
    if (i == rank) continue;
    status = CALL(send, send_buf[i], send_count[i], send_dt[i], static_cast<int>(i), c->comm, S(stream));
    if (status == C_SUCCESS) {
      status = CALL(recv, recv_buf[i], recv_count[i], recv_dt[i], static_cast<int>(i), c->comm, S(stream));
    }
  }
  C_Status end = CALL0(group_end);  // always closes the group, even after a refused call
  if (status != C_SUCCESS) return status;
  if (end != C_SUCCESS) return end;
  if (send_count[rank] == 0) return C_SUCCESS;
  return CALL(memcpy_d2d_async, c->device, S(stream), recv_buf[rank], send_buf[rank],
              send_count[rank] * send_bytes[rank]);
}

}  // namespace

void fill_collectives(C_DeviceInterface* p) {
  // One block (device.h): a plugin without all_reduce has none of them.
  if (g_iface.all_reduce == nullptr) return;
  p->xccl_get_comm_name = get_comm_name;
  p->xccl_get_unique_id_size = get_unique_id_size;
  p->xccl_get_unique_id = get_unique_id;
  p->xccl_comm_init_rank = comm_init_rank;
  p->xccl_destroy_comm = destroy_comm;
  p->xccl_all_reduce = all_reduce;
  p->xccl_broadcast = broadcast;
  p->xccl_reduce = reduce;
  p->xccl_all_gather = all_gather;
  p->xccl_reduce_scatter = reduce_scatter;
  p->xccl_group_start = group_start;
  p->xccl_group_end = group_end;
  p->xccl_send = send;
  p->xccl_recv = recv;
  p->xccl_all_to_all = all_to_all;
}

}  // namespace anychip::bridge
