// The simulator's collectives over shared memory; the design is described in collectives.h.
#include "sim/collectives.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "common/last_error.h"

using anychip::fail;

namespace anychip::sim::coll {
namespace {

constexpr size_t kSlotBytes = 1u << 20;
constexpr size_t kMailboxBytes = 256u << 10;
constexpr uint32_t kMagic = 0x616e7963;  // "anyc"
constexpr size_t kHeaderBytes = 4096;

struct Mailbox {
  std::atomic<uint32_t> posted;    // chunks the sender has put (wraps)
  std::atomic<uint32_t> consumed;  // chunks the receiver has taken
  uint64_t bytes;                  // size of the chunk in the box
};

struct Header {
  std::atomic<uint32_t> state;  // 0 fresh, 1 being initialised, 2 ready
  uint32_t magic;
  uint32_t nranks;
  std::atomic<uint32_t> joined;
  std::atomic<uint32_t> barrier_count;
  std::atomic<uint32_t> barrier_generation;  // futex word
  std::atomic<uint32_t> broken;              // a rank gave up: the others fail fast
  uint32_t pad;
  std::atomic<uint64_t> reached[kMaxRanks];  // barriers each rank has entered
  std::atomic<uint32_t> bell[kMaxRanks];     // point-to-point doorbells (futex words)
};
static_assert(sizeof(Header) <= kHeaderBytes, "header too large");
static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "process-shared atomics need lock-free 32-bit atomics");

size_t segment_bytes(int nranks) {
  size_t n = static_cast<size_t>(nranks);
  size_t boxes = (n * n * sizeof(Mailbox) + 4095) / 4096 * 4096;
  return kHeaderBytes + boxes + n * kSlotBytes + n * n * kMailboxBytes;
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout, nullptr, 0);
}

void wake_all(std::atomic<uint32_t>* word) { futex(word, FUTEX_WAKE, INT32_MAX, nullptr); }

// Sleeps while *word == seen, at most `seconds`.
void wait_change(std::atomic<uint32_t>* word, uint32_t seen, double seconds) {
  if (seconds <= 0) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  futex(word, FUTEX_WAIT, seen, &ts);
}

double timeout_seconds() {
  const char* env = std::getenv("ANYCHIP_COLLECTIVE_TIMEOUT");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    double v = std::strtod(env, &end);
    if (end != env && *end == '\0' && v > 0) return v;
  }
  return 60.0;
}

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_in(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

}  // namespace

struct Comm {
  std::string name, label;
  int rank = 0, nranks = 1;
  Header* header = nullptr;
  Mailbox* boxes = nullptr;
  char* slots = nullptr;
  char* mail = nullptr;
  size_t bytes = 0;
  uint64_t barriers = 0;     // barriers this rank has entered
  std::string failure;       // set once a collective failed: later ones fail with it
  char* slot(int r) const { return slots + static_cast<size_t>(r) * kSlotBytes; }
  Mailbox* box(int src, int dst) const { return boxes + src * nranks + dst; }
  char* mailbox(int src, int dst) const {
    return mail + (static_cast<size_t>(src) * nranks + dst) * kMailboxBytes;
  }
};

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::AllReduce: return "all_reduce";
    case Kind::Broadcast: return "broadcast";
    case Kind::Reduce: return "reduce";
    case Kind::AllGather: return "all_gather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllToAll: return "all_to_all";
    case Kind::Send: return "send";
    case Kind::Recv: return "recv";
  }
  return "?";
}

size_t dtype_size(int dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT32: case ANYCHIP_DTYPE_INT32: return 4;
    case ANYCHIP_DTYPE_FLOAT16: case ANYCHIP_DTYPE_BFLOAT16: case ANYCHIP_DTYPE_INT16: return 2;
    case ANYCHIP_DTYPE_FLOAT64: case ANYCHIP_DTYPE_INT64: return 8;
    case ANYCHIP_DTYPE_INT8: case ANYCHIP_DTYPE_UINT8: case ANYCHIP_DTYPE_BOOL: return 1;
    default: return 0;
  }
}

bool op_valid(int dtype, int op) {
  if (op < ANYCHIP_REDUCE_SUM || op > ANYCHIP_REDUCE_AVG) return false;
  return !(dtype == ANYCHIP_DTYPE_BOOL && op == ANYCHIP_REDUCE_AVG);
}

AnychipStatus make_unique_id(void* id, size_t size) {
  if (id == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "comm_get_unique_id: id is NULL");
  if (size < kIdBytes) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "comm_get_unique_id: size is %zu, needs %zu", size,
                kIdBytes);
  }
  std::random_device rd;
  char name[64];
  snprintf(name, sizeof(name), "/anychip-coll-%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  std::memset(id, 0, kIdBytes);
  std::memcpy(id, name, std::strlen(name));
  return ANYCHIP_OK;
}

AnychipStatus open(const void* id, size_t size, int rank, int nranks, const std::string& label,
                   Comm** out) {
  if (id == nullptr || size != kIdBytes) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                "%s: comm_init_rank: id must be the %zu bytes comm_get_unique_id wrote (got %zu)",
                label.c_str(), kIdBytes, id == nullptr ? size_t{0} : size);
  }
  const char* name = static_cast<const char*>(id);
  if (std::strncmp(name, "/anychip-coll-", 14) != 0 || strnlen(name, kIdBytes) > 60) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                "%s: comm_init_rank: id is not a unique id of this simulator", label.c_str());
  }
  if (nranks < 1 || nranks > kMaxRanks) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: comm_init_rank: nranks must be 1..%d, got %d",
                label.c_str(), kMaxRanks, nranks);
  }
  if (rank < 0 || rank >= nranks) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: comm_init_rank: rank must be 0..%d, got %d",
                label.c_str(), nranks - 1, rank);
  }
  if (out == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "comm_init_rank: comm is NULL");
  int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  if (fd < 0) {
    return fail(ANYCHIP_ERROR_DEVICE, "%s: comm_init_rank: shm_open(%s) failed: %s", label.c_str(),
                name, strerror(errno));
  }
  size_t bytes = segment_bytes(nranks);
  struct stat st;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) < bytes && ftruncate(fd, bytes) != 0) {
    int err = errno;
    ::close(fd);
    return fail(ANYCHIP_ERROR_DEVICE, "%s: comm_init_rank: sizing %s to %zu bytes failed: %s",
                label.c_str(), name, bytes, strerror(err));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    return fail(ANYCHIP_ERROR_DEVICE, "%s: comm_init_rank: mmap of %s failed: %s", label.c_str(),
                name, strerror(errno));
  }
  auto* h = static_cast<Header*>(base);
  uint32_t expected = 0;
  if (h->state.compare_exchange_strong(expected, 1)) {
    h->magic = kMagic;
    h->nranks = static_cast<uint32_t>(nranks);
    h->state.store(2, std::memory_order_release);
    wake_all(&h->state);
  } else {
    auto deadline = deadline_in(timeout_seconds());
    while (h->state.load(std::memory_order_acquire) != 2 && seconds_left(deadline) > 0) {
      wait_change(&h->state, 1, 0.01);
    }
  }
  if (h->state.load(std::memory_order_acquire) != 2 || h->magic != kMagic ||
      h->nranks != static_cast<uint32_t>(nranks)) {
    uint32_t theirs = h->nranks;
    munmap(base, bytes);
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                "%s: comm_init_rank: rank %d says nranks=%d, the communicator was created with %u",
                label.c_str(), rank, nranks, theirs);
  }
  auto* c = new Comm;
  c->name = name;
  c->label = label;
  c->rank = rank;
  c->nranks = nranks;
  c->header = h;
  c->bytes = bytes;
  char* p = static_cast<char*>(base) + kHeaderBytes;
  c->boxes = reinterpret_cast<Mailbox*>(p);
  p += (static_cast<size_t>(nranks) * nranks * sizeof(Mailbox) + 4095) / 4096 * 4096;
  c->slots = p;
  c->mail = p + static_cast<size_t>(nranks) * kSlotBytes;
  if (h->joined.fetch_add(1) + 1 == static_cast<uint32_t>(nranks)) shm_unlink(name);
  *out = c;
  return ANYCHIP_OK;
}

void close(Comm* comm) {
  if (comm == nullptr) return;
  shm_unlink(comm->name.c_str());  // ENOENT once every rank joined: harmless
  munmap(comm->header, comm->bytes);
  delete comm;
}

int rank_of(const Comm* comm) { return comm->rank; }
int nranks_of(const Comm* comm) { return comm->nranks; }

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// Records the failure on the communicator (later calls fail with it) and returns it.
AnychipStatus give_up(Comm* c, const std::string& message) {
  if (c->failure.empty()) c->failure = message;
  shm_unlink(c->name.c_str());  // a failed communicator takes no new ranks: nothing stale remains
  c->header->broken.store(1);
  wake_all(&c->header->barrier_generation);
  for (int r = 0; r < c->nranks; ++r) {
    c->header->bell[r].fetch_add(1);
    wake_all(&c->header->bell[r]);
  }
  return fail(ANYCHIP_ERROR_DEVICE, "%s", message.c_str());
}

AnychipStatus barrier(Comm* c, const char* what, Clock::time_point deadline, double timeout) {
  Header* h = c->header;
  uint64_t mine = ++c->barriers;
  uint32_t generation = h->barrier_generation.load(std::memory_order_acquire);
  h->reached[c->rank].store(mine, std::memory_order_release);
  if (h->barrier_count.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(c->nranks)) {
    h->barrier_count.store(0, std::memory_order_relaxed);
    h->barrier_generation.fetch_add(1, std::memory_order_release);
    wake_all(&h->barrier_generation);
    return ANYCHIP_OK;
  }
  while (h->barrier_generation.load(std::memory_order_acquire) == generation) {
    double left = seconds_left(deadline);
    bool broken = h->broken.load() != 0;
    if (left <= 0 || broken) {
      std::vector<int> arrived, missing;
      for (int r = 0; r < c->nranks; ++r) {
        (h->reached[r].load() >= mine ? arrived : missing).push_back(r);
      }
      char buf[512];
      snprintf(buf, sizeof(buf),
               "%s: %s on rank %d of %d %s: ranks arrived: %s; not arrived: %s "
               "(ANYCHIP_COLLECTIVE_TIMEOUT=%g s)",
               c->label.c_str(), what, c->rank, c->nranks,
               broken && left > 0 ? "failed because another rank gave up waiting"
                                  : "timed out waiting for the other ranks",
               rank_list(arrived).c_str(), rank_list(missing).c_str(), timeout);
      return give_up(c, buf);
    }
    wait_change(&h->barrier_generation, generation, std::min(left, 0.1));
  }
  return ANYCHIP_OK;
}

// ---- element-wise reduction -------------------------------------------------------------------

float bf16_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

template <typename A>
A apply(AnychipReduceOp op, A a, A b) {
  switch (op) {
    case ANYCHIP_REDUCE_SUM: case ANYCHIP_REDUCE_AVG: return a + b;
    case ANYCHIP_REDUCE_PROD: return a * b;
    case ANYCHIP_REDUCE_MAX: return b > a ? b : a;
    case ANYCHIP_REDUCE_MIN: return b < a ? b : a;
  }
  return a;
}

// Integers wrap (two's complement) on sum and prod, as on a device.
template <typename T>
T apply_int(AnychipReduceOp op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ANYCHIP_REDUCE_SUM: case ANYCHIP_REDUCE_AVG:
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    case ANYCHIP_REDUCE_PROD:
      return static_cast<T>(static_cast<U>(static_cast<uint64_t>(static_cast<U>(a)) *
                                           static_cast<uint64_t>(static_cast<U>(b))));
    default: return apply(op, a, b);
  }
}

// dst[i] = op over s of srcs[s][i], i < n, in rank order; avg divides by `nranks` once.
template <typename T, typename A, typename Load, typename Store>
void reduce_float(void* dst, const std::vector<const char*>& srcs, size_t n, AnychipReduceOp op,
                  int nranks, Load load, Store store) {
  T* out = static_cast<T*>(dst);
  for (size_t i = 0; i < n; ++i) {
    A acc = load(reinterpret_cast<const T*>(srcs[0])[i]);
    for (size_t s = 1; s < srcs.size(); ++s) acc = apply(op, acc, load(reinterpret_cast<const T*>(srcs[s])[i]));
    if (op == ANYCHIP_REDUCE_AVG) acc = acc / static_cast<A>(nranks);
    out[i] = store(acc);
  }
}

template <typename T>
void reduce_int(void* dst, const std::vector<const char*>& srcs, size_t n, AnychipReduceOp op,
                int nranks) {
  T* out = static_cast<T*>(dst);
  for (size_t i = 0; i < n; ++i) {
    T acc = reinterpret_cast<const T*>(srcs[0])[i];
    for (size_t s = 1; s < srcs.size(); ++s) acc = apply_int(op, acc, reinterpret_cast<const T*>(srcs[s])[i]);
    if (op == ANYCHIP_REDUCE_AVG) acc = static_cast<T>(acc / static_cast<T>(nranks));
    out[i] = acc;
  }
}

void reduce(void* dst, const std::vector<const char*>& srcs, size_t n, AnychipDtype dtype,
            AnychipReduceOp op, int nranks) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT32:
      return reduce_float<float, float>(dst, srcs, n, op, nranks, [](float v) { return v; },
                                        [](float v) { return v; });
    case ANYCHIP_DTYPE_FLOAT64:
      return reduce_float<double, double>(dst, srcs, n, op, nranks, [](double v) { return v; },
                                          [](double v) { return v; });
    case ANYCHIP_DTYPE_FLOAT16:
      return reduce_float<_Float16, float>(dst, srcs, n, op, nranks,
                                           [](_Float16 v) { return static_cast<float>(v); },
                                           [](float v) { return static_cast<_Float16>(v); });
    case ANYCHIP_DTYPE_BFLOAT16:
      return reduce_float<uint16_t, float>(dst, srcs, n, op, nranks, bf16_to_float, float_to_bf16);
    case ANYCHIP_DTYPE_INT8: return reduce_int<int8_t>(dst, srcs, n, op, nranks);
    case ANYCHIP_DTYPE_UINT8: return reduce_int<uint8_t>(dst, srcs, n, op, nranks);
    case ANYCHIP_DTYPE_INT16: return reduce_int<int16_t>(dst, srcs, n, op, nranks);
    case ANYCHIP_DTYPE_INT32: return reduce_int<int32_t>(dst, srcs, n, op, nranks);
    case ANYCHIP_DTYPE_INT64: return reduce_int<int64_t>(dst, srcs, n, op, nranks);
    case ANYCHIP_DTYPE_BOOL: {
      // sum and max: logical or; prod and min: logical and.
      bool any = op == ANYCHIP_REDUCE_SUM || op == ANYCHIP_REDUCE_MAX;
      uint8_t* out = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) {
        bool acc = srcs[0][i] != 0;
        for (size_t s = 1; s < srcs.size(); ++s) acc = any ? (acc || srcs[s][i] != 0) : (acc && srcs[s][i] != 0);
        out[i] = acc ? 1 : 0;
      }
      return;
    }
  }
}

// ---- the collectives, chunk by chunk through the slots ----------------------------------------

AnychipStatus run_collective(const Op& op, double timeout) {
  Comm* c = op.comm;
  const char* what = kind_name(op.kind);
  const size_t es = dtype_size(op.dtype);
  const int n = c->nranks, me = c->rank;
  const char* send = static_cast<const char*>(op.send);
  char* recv = static_cast<char*>(op.recv);
  auto deadline = deadline_in(timeout);
  // all_reduce, broadcast, reduce, all_gather: a chunk is `len` elements of each rank's buffer.
  // reduce_scatter and all_to_all: a chunk is `len` elements of each of the n slices.
  bool sliced = op.kind == Kind::ReduceScatter || op.kind == Kind::AllToAll;
  size_t per_chunk = kSlotBytes / es / (sliced ? static_cast<size_t>(n) : 1);
  std::vector<const char*> srcs(n);
  for (int r = 0; r < n; ++r) srcs[r] = c->slot(r);
  size_t off = 0;
  do {
    size_t len = std::min(per_chunk, op.count - off);
    size_t lb = len * es, ob = off * es, cb = op.count * es;
    // 1. copy in
    switch (op.kind) {
      case Kind::AllReduce: case Kind::Reduce: case Kind::AllGather:
        std::memcpy(c->slot(me), send + ob, lb);
        break;
      case Kind::Broadcast:
        if (me == op.root) std::memcpy(c->slot(me), send + ob, lb);
        break;
      case Kind::ReduceScatter: case Kind::AllToAll:
        for (int j = 0; j < n; ++j) std::memcpy(c->slot(me) + j * lb, send + j * cb + ob, lb);
        break;
      default: break;
    }
    if (AnychipStatus s = barrier(c, what, deadline, timeout)) return s;
    // 2. reduce or copy out
    switch (op.kind) {
      case Kind::AllReduce:
        reduce(recv + ob, srcs, len, op.dtype, op.op, n);
        break;
      case Kind::Reduce:
        if (me == op.root) reduce(recv + ob, srcs, len, op.dtype, op.op, n);
        break;
      case Kind::Broadcast:
        std::memcpy(recv + ob, c->slot(op.root), lb);
        break;
      case Kind::AllGather:
        for (int r = 0; r < n; ++r) std::memcpy(recv + r * cb + ob, c->slot(r), lb);
        break;
      case Kind::ReduceScatter: {
        std::vector<const char*> mine(n);
        for (int r = 0; r < n; ++r) mine[r] = c->slot(r) + me * lb;
        reduce(recv + ob, mine, len, op.dtype, op.op, n);
        break;
      }
      case Kind::AllToAll:
        for (int r = 0; r < n; ++r) std::memcpy(recv + r * cb + ob, c->slot(r) + me * lb, lb);
        break;
      default: break;
    }
    if (AnychipStatus s = barrier(c, what, deadline, timeout)) return s;
    off += len;
  } while (off < op.count);
  return ANYCHIP_OK;
}

// ---- point to point: mailboxes, progressed together ------------------------------------------

struct P2P {
  const Op* op;
  size_t done = 0;  // bytes moved
  bool finished = false;
};

// One step of a send or recv if its mailbox allows; true when it moved data.
bool step(P2P& p) {
  const Op& op = *p.op;
  Comm* c = op.comm;
  size_t total = op.count * dtype_size(op.dtype);
  bool is_send = op.kind == Kind::Send;
  int src = is_send ? c->rank : op.root, dst = is_send ? op.root : c->rank;
  Mailbox* box = c->box(src, dst);
  uint32_t posted = box->posted.load(std::memory_order_acquire);
  uint32_t consumed = box->consumed.load(std::memory_order_acquire);
  if (is_send) {
    if (posted != consumed) return false;  // the peer has not taken the last chunk
    size_t len = std::min(kMailboxBytes, total - p.done);
    std::memcpy(c->mailbox(src, dst), static_cast<const char*>(op.send) + p.done, len);
    box->bytes = len;
    box->posted.store(posted + 1, std::memory_order_release);
    p.done += len;
  } else {
    if (posted == consumed) return false;  // nothing there yet
    size_t len = box->bytes;
    if (len > total - p.done) len = total - p.done;  // a mismatched count: take what fits
    std::memcpy(static_cast<char*>(op.recv) + p.done, c->mailbox(src, dst), len);
    box->consumed.store(consumed + 1, std::memory_order_release);
    p.done += len;
  }
  int peer = is_send ? dst : src;
  c->header->bell[peer].fetch_add(1, std::memory_order_release);
  wake_all(&c->header->bell[peer]);
  if (p.done >= total) p.finished = true;
  return true;
}

AnychipStatus run_p2p(const std::vector<const Op*>& ops, double timeout) {
  std::vector<P2P> work;
  for (const Op* op : ops) work.push_back(P2P{op});
  // A zero-element transfer still posts one empty chunk, so the pair stays in step.
  auto deadline = deadline_in(timeout);
  Comm* first = ops[0]->comm;
  for (;;) {
    uint32_t bell = first->header->bell[first->rank].load(std::memory_order_acquire);
    bool progressed = false, all_done = true;
    // Transfers between the same pair, in the same direction, keep their order.
    std::set<std::tuple<Comm*, int, bool>> busy;
    for (P2P& p : work) {
      if (p.finished) continue;
      all_done = false;
      auto key = std::make_tuple(p.op->comm, p.op->root, p.op->kind == Kind::Send);
      if (busy.count(key)) continue;
      busy.insert(key);
      while (!p.finished && step(p)) progressed = true;
    }
    if (all_done) return ANYCHIP_OK;
    if (progressed) continue;
    for (P2P& p : work) {  // a peer that gave up will never post: fail now, not at the timeout
      if (!p.finished && p.op->comm->header->broken.load() != 0) {
        char buf[256];
        snprintf(buf, sizeof(buf), "%s: %s %s rank %d failed: another rank of the communicator "
                 "gave up waiting (ANYCHIP_COLLECTIVE_TIMEOUT=%g s)", p.op->comm->label.c_str(),
                 kind_name(p.op->kind), p.op->kind == Kind::Send ? "to" : "from", p.op->root,
                 timeout);
        return give_up(p.op->comm, buf);
      }
    }
    double left = seconds_left(deadline);
    if (left <= 0) {
      std::string pending;
      for (P2P& p : work) {
        if (p.finished) continue;
        char buf[160];
        snprintf(buf, sizeof(buf), "%s%s %s rank %d (%zu of %zu bytes moved)",
                 pending.empty() ? "" : "; ", kind_name(p.op->kind),
                 p.op->kind == Kind::Send ? "to" : "from", p.op->root, p.done,
                 p.op->count * dtype_size(p.op->dtype));
        pending += buf;
      }
      char buf[768];
      snprintf(buf, sizeof(buf),
               "%s: rank %d of %d timed out waiting for its peers: %s; the peer never posted the "
               "matching call (ANYCHIP_COLLECTIVE_TIMEOUT=%g s)",
               first->label.c_str(), first->rank, first->nranks, pending.c_str(), timeout);
      return give_up(work[0].op->comm, buf);
    }
    // Several communicators in one group: poll them, the doorbell covers the first.
    wait_change(&first->header->bell[first->rank], bell, std::min(left, 0.005));
  }
}

}  // namespace

AnychipStatus run(const std::vector<Op>& ops) {
  double timeout = timeout_seconds();
  for (const Op& op : ops) {
    if (!op.comm->failure.empty()) {
      return fail(ANYCHIP_ERROR_DEVICE, "%s: %s on a communicator that already failed: %s",
                  op.comm->label.c_str(), kind_name(op.kind), op.comm->failure.c_str());
    }
  }
  size_t i = 0;
  while (i < ops.size()) {
    if (ops[i].kind == Kind::Send || ops[i].kind == Kind::Recv) {
      std::vector<const Op*> batch;
      while (i < ops.size() && (ops[i].kind == Kind::Send || ops[i].kind == Kind::Recv)) {
        batch.push_back(&ops[i++]);
      }
      if (AnychipStatus s = run_p2p(batch, timeout)) return s;
    } else {
      if (AnychipStatus s = run_collective(ops[i++], timeout)) return s;
    }
  }
  return ANYCHIP_OK;
}

}  // namespace anychip::sim::coll
