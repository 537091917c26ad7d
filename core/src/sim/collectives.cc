// The simulator's collectives over shared memory; the design is described in collectives.h.
#include "sim/collectives.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <signal.h>
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
#include <type_traits>

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
  // Direct transfers (process_vm_readv), see collectives.h.
  std::atomic<uint32_t> direct_off;          // a rank's probe failed (or it opted out): staged only
  std::atomic<uint32_t> died;                // 1 + a rank whose process a peer found gone
  uint64_t token[kMaxRanks];                 // each rank's process token (same process: same token)
  uint64_t token_addr[kMaxRanks];            // where that token lives in the rank's process
  int64_t pid[kMaxRanks];
  std::atomic<uint64_t> send_addr[kMaxRanks];  // the current collective's buffers, per rank
  std::atomic<uint64_t> recv_addr[kMaxRanks];
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

// This process's token: random, so ranks that share a pid number from different pid namespaces
// never take each other for the same process; the probe reads it from the peer.
const uint64_t& process_token_word() {
  static const uint64_t token = [] {
    std::random_device rd;
    uint64_t t = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
    return t == 0 ? 1 : t;
  }();
  return token;
}

uint64_t process_token() { return process_token_word(); }

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
  int direct = 0;            // direct transfers: 0 not decided yet, 1 on, -1 off (all ranks agree)
  std::vector<char> scratch; // peers' pieces on their way into a reduction
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
  h->token[rank] = process_token();
  h->token_addr[rank] = reinterpret_cast<uint64_t>(&process_token_word());
  h->pid[rank] = getpid();
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

// Gives up on barrier number `mine`: it timed out, or (`broken`) another rank gave up.
AnychipStatus abandon(Comm* c, const char* what, uint64_t mine, bool broken, double timeout) {
  Header* h = c->header;
  std::vector<int> arrived, missing;
  for (int r = 0; r < c->nranks; ++r) {
    (h->reached[r].load() >= mine ? arrived : missing).push_back(r);
  }
  char buf[512], why[128];
  uint32_t died = h->died.load();
  if (died != 0) {
    snprintf(why, sizeof(why), "failed because rank %u died during the collective", died - 1);
  } else {
    snprintf(why, sizeof(why), "%s", broken ? "failed because another rank gave up waiting"
                                            : "timed out waiting for the other ranks");
  }
  snprintf(buf, sizeof(buf),
           "%s: %s on rank %d of %d %s: ranks arrived: %s; not arrived: %s "
           "(ANYCHIP_COLLECTIVE_TIMEOUT=%g s)",
           c->label.c_str(), what, c->rank, c->nranks, why, rank_list(arrived).c_str(),
           rank_list(missing).c_str(), timeout);
  return give_up(c, buf);
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
    if (left <= 0 || broken) return abandon(c, what, mine, broken && left > 0, timeout);
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

// One step of the reduction, `Op` fixed so the loops below vectorize. Integers wrap (two's
// complement) on sum and prod, as on a device.
template <int Op, typename A>
inline A combine(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    if constexpr (Op == ANYCHIP_REDUCE_SUM || Op == ANYCHIP_REDUCE_AVG) {
      return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    } else if constexpr (Op == ANYCHIP_REDUCE_PROD) {
      return static_cast<A>(static_cast<U>(static_cast<uint64_t>(static_cast<U>(a)) *
                                           static_cast<uint64_t>(static_cast<U>(b))));
    } else if constexpr (Op == ANYCHIP_REDUCE_MAX) {
      return b > a ? b : a;
    } else {
      return b < a ? b : a;
    }
  } else {
    if constexpr (Op == ANYCHIP_REDUCE_SUM || Op == ANYCHIP_REDUCE_AVG) return a + b;
    else if constexpr (Op == ANYCHIP_REDUCE_PROD) return a * b;
    else if constexpr (Op == ANYCHIP_REDUCE_MAX) return b > a ? b : a;
    else return b < a ? b : a;
  }
}

// dst[i] = op over s of srcs[s][i], i < n, in rank order, accumulated in A; avg divides by
// `nranks` once. dst may be one of the sources (in place): element i of dst is written after
// every source's element i was read (the last pass reads its source and writes dst element by
// element, so ivdep: an exact alias is no dependence between iterations).
template <typename T, typename A, int Op, typename Load, typename Store>
void reduce_blocked(void* dst, const std::vector<const char*>& srcs, size_t n, int nranks,
                    Load load, Store store) {
  auto finish = [nranks](A v) {
    if constexpr (Op == ANYCHIP_REDUCE_AVG) v = static_cast<A>(v / static_cast<A>(nranks));
    return v;
  };
  T* out = static_cast<T*>(dst);
  const size_t ns = srcs.size();
  const T* s0 = reinterpret_cast<const T*>(srcs[0]);
  if (ns == 1) {
    for (size_t i = 0; i < n; ++i) out[i] = store(finish(load(s0[i])));
    return;
  }
  const T* s1 = reinterpret_cast<const T*>(srcs[1]);
  if (ns == 2) {
#pragma GCC ivdep
    for (size_t i = 0; i < n; ++i) out[i] = store(finish(combine<Op, A>(load(s0[i]), load(s1[i]))));
    return;
  }
  constexpr size_t kBlock = 1024;
  A acc[kBlock];
  const T* last = reinterpret_cast<const T*>(srcs[ns - 1]);
  for (size_t i0 = 0; i0 < n; i0 += kBlock) {
    size_t m = std::min(kBlock, n - i0);
    for (size_t i = 0; i < m; ++i) acc[i] = combine<Op, A>(load(s0[i0 + i]), load(s1[i0 + i]));
    for (size_t s = 2; s + 1 < ns; ++s) {
      const T* p = reinterpret_cast<const T*>(srcs[s]) + i0;
      for (size_t i = 0; i < m; ++i) acc[i] = combine<Op, A>(acc[i], load(p[i]));
    }
    T* o = out + i0;
    const T* p = last + i0;
#pragma GCC ivdep
    for (size_t i = 0; i < m; ++i) o[i] = store(finish(combine<Op, A>(acc[i], load(p[i]))));
  }
}

template <typename T, typename A = T, typename Load, typename Store>
void reduce_typed(void* dst, const std::vector<const char*>& srcs, size_t n, AnychipReduceOp op,
                  int nranks, Load load, Store store) {
  switch (op) {
    case ANYCHIP_REDUCE_SUM:
      return reduce_blocked<T, A, ANYCHIP_REDUCE_SUM>(dst, srcs, n, nranks, load, store);
    case ANYCHIP_REDUCE_PROD:
      return reduce_blocked<T, A, ANYCHIP_REDUCE_PROD>(dst, srcs, n, nranks, load, store);
    case ANYCHIP_REDUCE_MAX:
      return reduce_blocked<T, A, ANYCHIP_REDUCE_MAX>(dst, srcs, n, nranks, load, store);
    case ANYCHIP_REDUCE_MIN:
      return reduce_blocked<T, A, ANYCHIP_REDUCE_MIN>(dst, srcs, n, nranks, load, store);
    case ANYCHIP_REDUCE_AVG:
      return reduce_blocked<T, A, ANYCHIP_REDUCE_AVG>(dst, srcs, n, nranks, load, store);
  }
}

template <typename T>
void reduce_float(void* dst, const std::vector<const char*>& srcs, size_t n, AnychipReduceOp op,
                  int nranks) {
  reduce_typed<T>(dst, srcs, n, op, nranks, [](T v) { return v; }, [](T v) { return v; });
}

template <typename T>
void reduce_int(void* dst, const std::vector<const char*>& srcs, size_t n, AnychipReduceOp op,
                int nranks) {
  reduce_typed<T>(dst, srcs, n, op, nranks, [](T v) { return v; }, [](T v) { return v; });
}

void reduce(void* dst, const std::vector<const char*>& srcs, size_t n, AnychipDtype dtype,
            AnychipReduceOp op, int nranks) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT32:
      return reduce_float<float>(dst, srcs, n, op, nranks);
    case ANYCHIP_DTYPE_FLOAT64:
      return reduce_float<double>(dst, srcs, n, op, nranks);
    case ANYCHIP_DTYPE_FLOAT16:
      return reduce_typed<_Float16, float>(dst, srcs, n, op, nranks,
                                           [](_Float16 v) { return static_cast<float>(v); },
                                           [](float v) { return static_cast<_Float16>(v); });
    case ANYCHIP_DTYPE_BFLOAT16:
      return reduce_typed<uint16_t, float>(dst, srcs, n, op, nranks, bf16_to_float, float_to_bf16);
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


// ---- the collectives, directly between the ranks' buffers (large messages) -------------------

// Below: the staged path (measured on 2 processes: as fast at 512 KiB, faster below).
constexpr size_t kDirectMinBytes = 512u << 10;
constexpr size_t kPieceBytes = 256u << 10;      // a peer's piece of a reduction, read into scratch

bool direct_allowed_by_env() {
  const char* env = std::getenv("ANYCHIP_COLLECTIVE_DIRECT");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

bool same_process(const Comm* c, int r) { return c->header->token[r] == process_token(); }

// Copies `len` bytes at `addr` of rank r's process to `dst`: 0, or the errno.
int read_peer(const Comm* c, int r, uint64_t addr, void* dst, size_t len) {
  if (len == 0) return 0;
  if (same_process(c, r)) {
    std::memmove(dst, reinterpret_cast<const void*>(addr), len);
    return 0;
  }
  auto pid = static_cast<pid_t>(c->header->pid[r]);
  char* d = static_cast<char*>(dst);
  while (len > 0) {
    iovec local{d, len}, remote{reinterpret_cast<void*>(addr), len};
    ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EFAULT;
    d += got;
    addr += static_cast<uint64_t>(got);
    len -= static_cast<size_t>(got);
  }
  return 0;
}

AnychipStatus read_failed(Comm* c, const char* what, int r, int err, double timeout) {
  auto pid = static_cast<pid_t>(c->header->pid[r]);
  bool dead = err == ESRCH || (kill(pid, 0) != 0 && errno == ESRCH);
  char buf[512];
  if (!dead && c->header->broken.load() != 0) {
    // A rank gave up (and may have left, its buffers with it): fail as at the next barrier.
    return abandon(c, what, c->barriers + 1, true, timeout);
  }
  if (dead) {
    uint32_t none = 0;
    c->header->died.compare_exchange_strong(none, static_cast<uint32_t>(r) + 1);
    snprintf(buf, sizeof(buf),
             "%s: %s on rank %d of %d failed: rank %d died during the collective (its process %d "
             "is gone); not arrived: %d (ANYCHIP_COLLECTIVE_TIMEOUT=%g s)",
             c->label.c_str(), what, c->rank, c->nranks, r, static_cast<int>(pid), r, timeout);
  } else {
    snprintf(buf, sizeof(buf),
             "%s: %s on rank %d of %d failed: reading rank %d's buffer (process %d) failed: %s "
             "(ANYCHIP_COLLECTIVE_TIMEOUT=%g s)",
             c->label.c_str(), what, c->rank, c->nranks, r, static_cast<int>(pid), strerror(err),
             timeout);
  }
  return give_up(c, buf);
}

// Balanced split of `count` elements in n shares: share r is [share_lo(r), share_lo(r + 1)).
size_t share_lo(size_t count, int n, int r) {
  size_t q = count / static_cast<size_t>(n), m = count % static_cast<size_t>(n);
  auto rr = static_cast<size_t>(r);
  return q * rr + std::min(rr, m);
}

// dst[0, len) = op over ranks (in rank order) of element `first` onwards of the buffer at
// `addrs[r]` in rank r's process, read piece by piece (peers of other processes through scratch).
AnychipStatus reduce_direct(Comm* c, const char* what, const std::vector<uint64_t>& addrs,
                            size_t first, size_t len, char* dst, const Op& op, double timeout) {
  const size_t es = dtype_size(op.dtype);
  const int n = c->nranks;
  const size_t piece = std::max<size_t>(kPieceBytes / es, 1);
  int remote = 0;
  for (int r = 0; r < n; ++r) remote += same_process(c, r) ? 0 : 1;
  if (c->scratch.size() < static_cast<size_t>(remote) * piece * es) {
    c->scratch.resize(static_cast<size_t>(remote) * piece * es);
  }
  std::vector<const char*> srcs(n);
  for (size_t done = 0; done < len;) {
    size_t m = std::min(piece, len - done);
    size_t ob = (first + done) * es;
    int k = 0;
    for (int r = 0; r < n; ++r) {
      if (same_process(c, r)) {
        srcs[r] = reinterpret_cast<const char*>(addrs[r]) + ob;
        continue;
      }
      char* s = c->scratch.data() + static_cast<size_t>(k++) * piece * es;
      if (int err = read_peer(c, r, addrs[r] + ob, s, m * es)) return read_failed(c, what, r, err, timeout);
      srcs[r] = s;
    }
    // Element i of dst is written after every source's element i was read: in place is safe.
    reduce(dst + done * es, srcs, m, op.dtype, op.op, n);
    done += m;
  }
  return ANYCHIP_OK;
}

// Whether the collective goes direct; decides once per communicator, at its first large
// collective, the same on every rank: each rank reads every other process's token through
// process_vm_readv, and any failure (or ANYCHIP_COLLECTIVE_DIRECT=0) turns it off for all.
// Runs after the barrier that published the buffers.
AnychipStatus decide_direct(Comm* c, const char* what, Clock::time_point deadline, double timeout,
                            bool* use) {
  Header* h = c->header;
  if (c->direct == 0) {
    bool ok = direct_allowed_by_env();
    for (int r = 0; ok && r < c->nranks; ++r) {
      if (same_process(c, r)) continue;
      uint64_t seen = 0;
      ok = read_peer(c, r, h->token_addr[r], &seen, sizeof(seen)) == 0 && seen == h->token[r];
    }
    if (!ok) h->direct_off.store(1);
    if (AnychipStatus s = barrier(c, what, deadline, timeout)) return s;
    c->direct = h->direct_off.load() != 0 ? -1 : 1;
  }
  *use = c->direct > 0;
  return ANYCHIP_OK;
}

bool direct_eligible(const Op& op) {
  const Comm* c = op.comm;
  if (c->nranks < 2 || c->direct < 0) return false;
  size_t bytes = op.count * dtype_size(op.dtype);
  bool sliced = op.kind == Kind::AllGather || op.kind == Kind::ReduceScatter ||
                op.kind == Kind::AllToAll;
  if (sliced) bytes *= static_cast<size_t>(c->nranks);
  return bytes >= kDirectMinBytes;
}

// The direct path: publish the buffers, barrier, each rank reads what it needs from the peers'
// buffers (process_vm_readv, or memcpy in one process), barrier(s). A buffer a peer reads is
// never written before a barrier that follows the peer's reads, so in place is safe; the last
// barrier keeps every buffer as it is until no peer reads it any more. *done is false when the
// communicator decided against direct transfers: the caller runs the staged path.
AnychipStatus run_direct(const Op& op, double timeout, Clock::time_point deadline, bool* done) {
  Comm* c = op.comm;
  Header* h = c->header;
  const char* what = kind_name(op.kind);
  const size_t es = dtype_size(op.dtype);
  const int n = c->nranks, me = c->rank;
  const char* send = static_cast<const char*>(op.send);
  char* recv = static_cast<char*>(op.recv);
  const size_t cb = op.count * es;
  *done = false;
  h->send_addr[me].store(reinterpret_cast<uint64_t>(send), std::memory_order_relaxed);
  h->recv_addr[me].store(reinterpret_cast<uint64_t>(recv), std::memory_order_relaxed);
  if (AnychipStatus s = barrier(c, what, deadline, timeout)) return s;
  bool use = false;
  if (AnychipStatus s = decide_direct(c, what, deadline, timeout, &use)) return s;
  if (!use) return ANYCHIP_OK;
  *done = true;
  std::vector<uint64_t> sends(n), recvs(n);
  for (int r = 0; r < n; ++r) {
    sends[r] = h->send_addr[r].load(std::memory_order_relaxed);
    recvs[r] = h->recv_addr[r].load(std::memory_order_relaxed);
  }
  switch (op.kind) {
    case Kind::AllReduce: {
      // 1. Rank r reduces share r of every rank's send into share r of its recv; barrier; 2. it
      // reads the other shares from their owners' recv. A rank writes only its own memory (a
      // peer that gave up may already reuse its buffers); in place, share q of a rank's buffer
      // is read by rank q in 1 and overwritten only in 2, after the barrier.
      size_t lo = share_lo(op.count, n, me), hi = share_lo(op.count, n, me + 1);
      if (AnychipStatus s = reduce_direct(c, what, sends, lo, hi - lo, recv + lo * es, op, timeout)) {
        return s;
      }
      if (AnychipStatus s = barrier(c, what, deadline, timeout)) return s;
      for (int q = 0; q < n; ++q) {
        if (q == me) continue;
        size_t qlo = share_lo(op.count, n, q), qhi = share_lo(op.count, n, q + 1);
        if (int err = read_peer(c, q, recvs[q] + qlo * es, recv + qlo * es, (qhi - qlo) * es)) {
          return read_failed(c, what, q, err, timeout);
        }
      }
      break;
    }
    case Kind::Reduce:
      if (me == op.root) {
        if (AnychipStatus s = reduce_direct(c, what, sends, 0, op.count, recv, op, timeout)) return s;
      }
      break;
    case Kind::Broadcast:
      if (me != op.root) {
        if (int err = read_peer(c, op.root, sends[op.root], recv, cb)) return read_failed(c, what, op.root, err, timeout);
      } else if (recv != send) {
        std::memcpy(recv, send, cb);
      }
      break;
    case Kind::AllGather:
      for (int r = 0; r < n; ++r) {
        char* dst = recv + static_cast<size_t>(r) * cb;
        if (r == me) {
          if (dst != send) std::memmove(dst, send, cb);
        } else if (int err = read_peer(c, r, sends[r], dst, cb)) {
          return read_failed(c, what, r, err, timeout);
        }
      }
      break;
    case Kind::ReduceScatter: {
      std::vector<uint64_t> slices(n);
      for (int r = 0; r < n; ++r) slices[r] = sends[r] + static_cast<uint64_t>(me) * cb;
      if (AnychipStatus s = reduce_direct(c, what, slices, 0, op.count, recv, op, timeout)) return s;
      break;
    }
    case Kind::AllToAll:
      for (int r = 0; r < n; ++r) {
        if (int err = read_peer(c, r, sends[r] + static_cast<uint64_t>(me) * cb,
                                recv + static_cast<size_t>(r) * cb, cb)) {
          return read_failed(c, what, r, err, timeout);
        }
      }
      break;
    default: break;
  }
  return barrier(c, what, deadline, timeout);
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
  if (direct_eligible(op)) {
    bool done = false;
    if (AnychipStatus s = run_direct(op, timeout, deadline, &done)) return s;
    if (done) return ANYCHIP_OK;
  }
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
