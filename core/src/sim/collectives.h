// The simulator's collectives (device.h, ABI 1.2): NCCL-style communicators between simulated
// devices of one host, in other processes or in this one.
//
// A communicator is a POSIX shared-memory segment named from its unique id ("/anychip-coll-"
// and 32 random hex digits, so a crashed run's stale segment never meets a new run). It holds
//   - a header: the rank count, a sense-reversing barrier (an arrival counter and a generation
//     word that waiters sleep on with futex, process-shared), what barrier each rank reached
//     (for messages) and one doorbell futex word per rank for point-to-point traffic;
//   - one staging slot per rank (kSlotBytes): a collective moves in chunks that fit the slots,
//     each chunk "copy in, barrier, reduce or copy out, barrier", so the segment stays bounded
//     whatever the call's size;
//   - one mailbox per ordered pair of ranks (kMailboxBytes) for send/recv.
// Every wait is bounded by ANYCHIP_COLLECTIVE_TIMEOUT seconds (default 60): a rank that never
// arrives, or died, is an ANYCHIP_ERROR_DEVICE on the others naming the collective, the ranks
// that arrived, those that did not and the timeout. A communicator that failed so stays failed.
// Ranks on devices of one process map the same segment twice; the primitives work the same.
// The name is unlinked as soon as every rank has joined, when a rank gives up waiting, and
// (harmlessly, if already gone) by destroy: a run whose ranks crashed leaves nothing behind
// once one survivor timed out; in the worst case (every rank killed before all joined) a stale
// segment stays in /dev/shm, and is never reused, since ids are random.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "anychip/device.h"

namespace anychip::sim::coll {

constexpr size_t kIdBytes = ANYCHIP_COMM_UNIQUE_ID_BYTES;
constexpr int kMaxRanks = 64;

struct Comm;

enum class Kind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, Send, Recv };

struct Op {
  Kind kind;
  Comm* comm;
  const void* send;
  void* recv;
  size_t count;
  AnychipDtype dtype;
  AnychipReduceOp op;
  int root;  // broadcast/reduce root, send/recv peer
};

const char* kind_name(Kind kind);
// Bytes of one element; 0 for a dtype that is not an AnychipDtype.
size_t dtype_size(int dtype);
// Whether `op` is defined on `dtype` (avg is not defined on bool).
bool op_valid(int dtype, int op);

AnychipStatus make_unique_id(void* id, size_t size);
// Maps the segment named by `id`; does not wait for the other ranks (the first collective does).
AnychipStatus open(const void* id, size_t size, int rank, int nranks, const std::string& label,
                   Comm** out);
void close(Comm* comm);
int rank_of(const Comm* comm);
int nranks_of(const Comm* comm);

// Run on a stream's worker when the stream reaches the work: a collective, or a group of them
// (point-to-point operations of a group progress together, so they cannot deadlock).
AnychipStatus run(const std::vector<Op>& ops);

}  // namespace anychip::sim::coll
