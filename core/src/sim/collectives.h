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
//   - one mailbox per ordered pair of ranks (kMailboxBytes) for send/recv;
//   - for the direct path (below): each rank's pid, a random token of its process (ranks with the
//     same token are one process) and where that token lives, and the buffers of the current
//     collective, published by each rank at its start.
// Large messages (from 512 KiB a rank; all_to_all, all_gather and reduce_scatter count all n
// slices) go direct, with no staging: each rank reads what it needs straight from the peers'
// buffers with Linux Cross Memory Attach (process_vm_readv; memcpy for a peer in this process),
// between barriers: publish the buffers, barrier, read, barrier. all_reduce is a reduce-scatter
// then an all-gather: rank r reduces share r of every rank's send (peers' pieces of kPieceBytes
// read into scratch, reduced in rank order 0..n-1 as the staged path, so results are
// bit-identical) into share r of its own recv; barrier; it reads the other shares from their
// owners' recv; barrier. A rank only ever writes its own memory, and a buffer a peer reads is
// written only after a barrier that follows the peer's reads, which keeps device.h's in-place
// forms right. The last barrier keeps each buffer as it is until no peer reads it. The stream
// keeps the buffers open (AccessWindow) for the whole call, so checking mode's PROT_NONE never
// meets a peer's read. Whether a communicator goes direct is decided once, the same on every
// rank, at its first large collective: each rank reads every other process's token through
// process_vm_readv (it needs ptrace access: it fails under Yama ptrace_scope 1, Ubuntu's
// default, between ranks that are not each other's ancestors, under 2 and 3, under a seccomp
// filter, across users or pid namespaces), and any failure, or ANYCHIP_COLLECTIVE_DIRECT=0 on
// any rank, keeps it staged.
// A peer whose process is gone (ESRCH) is an ANYCHIP_ERROR_DEVICE naming that rank as died; the
// others then fail at once as when a rank gives up waiting.
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
