// anychip's simulated device: the whole AnychipDeviceInterface over host memory.
//
// One library backs every simulated chip; each anychip_device_init call makes an independent
// runtime from its options:
//   name=npu              device name used in messages ("npu:0")
//   model=Ascend 910B     product name shown in properties
//   vendor=Huawei
//   devices=2             device count
//   capacity=<bytes>      memory per device; allocations past it fail with OUT_OF_MEMORY
//   dtypes=<bitmask>      OR of ANYCHIP_DTYPE_BIT() the chip's kernels accept
//   cc=<int>              compute capability reported
//   alignment=<bytes>     allocation granularity (default 256)
//   checking=0|1          guard device memory with mprotect (see sim/arena.h)
//   simulated=0|1         0 only for the host CPU device, which is real hardware
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "anychip/device.h"
#include "common/last_error.h"
#include "common/options.h"
#include "sim/arena.h"
#include "sim/collectives.h"
#include "sim/stream.h"

using anychip::fail;
using anychip::sim::AccessWindow;
using anychip::sim::Arena;

struct AnychipStream_st {
  // shared: a synchronous call waits on a snapshot of the device's streams, without holding
  // the device lock, and a stream destroyed meanwhile must outlive that wait.
  std::shared_ptr<anychip::sim::Stream> stream;
};

struct AnychipEvent_st {
  std::shared_ptr<anychip::sim::Event> event;  // shared: a pending record may outlive destroy
};

namespace {

struct Device {
  std::unique_ptr<Arena> arena;
  std::mutex mu;
  std::set<AnychipStream_st*> streams;
  std::set<AnychipEvent_st*> events;
};

}  // namespace

struct AnychipComm_st {
  AnychipRuntime rt;
  int device;
  anychip::sim::coll::Comm* comm;
};

struct AnychipRuntime_st {
  std::string name = "sim", model = "anychip simulator", vendor = "anychip";
  std::mutex comm_mu;
  std::set<AnychipComm_st*> comms;  // live communicators (handles are checked against it)
  uint64_t device_count = 1, capacity = 1ull << 30, dtypes = 0, cc = 0, alignment = 256;
  bool checking = false, simulated = true, initialized = false;
  std::vector<std::unique_ptr<Device>> devices;
};

namespace {

using Rt = AnychipRuntime;

std::string label(Rt rt, int device) { return rt->name + ":" + std::to_string(device); }

AnychipStatus get_dev(Rt rt, int device, Device** out) {
  if (rt == nullptr || !rt->initialized) {
    return fail(ANYCHIP_ERROR_UNAVAILABLE, "%s: runtime is not initialized",
                rt ? rt->name.c_str() : "sim");
  }
  if (device < 0 || static_cast<uint64_t>(device) >= rt->device_count) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: device index %d out of range (0..%llu)",
                rt->name.c_str(), device, static_cast<unsigned long long>(rt->device_count - 1));
  }
  *out = rt->devices[device].get();
  return ANYCHIP_OK;
}

#define GET_DEV(rt, device, dev)                        \
  Device* dev = nullptr;                                \
  if (AnychipStatus s_ = get_dev(rt, device, &dev)) return s_

AnychipStatus check_stream(Rt rt, int device, Device* dev, AnychipStream stream) {
  std::lock_guard<std::mutex> lock(dev->mu);
  if (stream == nullptr || !dev->streams.count(stream)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: stream %p is not a live stream of this device",
                label(rt, device).c_str(), static_cast<void*>(stream));
  }
  return ANYCHIP_OK;
}

AnychipStatus check_event(Rt rt, int device, Device* dev, AnychipEvent event) {
  std::lock_guard<std::mutex> lock(dev->mu);
  if (event == nullptr || !dev->events.count(event)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: event %p is not a live event of this device",
                label(rt, device).c_str(), static_cast<void*>(event));
  }
  return ANYCHIP_OK;
}

#define CHECK(expr) \
  if (AnychipStatus s_ = (expr)) return s_

// The device's streams as of now, less the one whose host function is calling (its earlier
// work has run, in order, and waiting for it would wait for the caller itself). Taken under
// the lock, waited on without it, so that work on one stream may call the runtime while
// another thread waits for that stream.
std::vector<std::shared_ptr<anychip::sim::Stream>> other_streams(Device* dev) {
  std::lock_guard<std::mutex> lock(dev->mu);
  std::vector<std::shared_ptr<anychip::sim::Stream>> out;
  for (AnychipStream_st* s : dev->streams) {
    if (!s->stream->runs_on_this_thread()) out.push_back(s->stream);
  }
  return out;
}

// Synchronous operations are ordered after all enqueued work of the device (device.h).
void wait_streams(Device* dev) {
  for (const auto& s : other_streams(dev)) s->wait_idle();
}

// Waiting for a stream from its own work can never finish: an error, not a hang.
AnychipStatus check_not_own_work(Rt rt, int device, AnychipStream stream, const char* what) {
  if (stream->stream->runs_on_this_thread()) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                "%s: %s called from a host function running on that stream: it would wait for "
                "itself", label(rt, device).c_str(), what);
  }
  return ANYCHIP_OK;
}

// A host pointer that is really device memory means the caller swapped the copy direction.
AnychipStatus check_host(Rt rt, int device, Device* dev, const void* host, const char* what) {
  if (host == nullptr) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", label(rt, device).c_str(), what);
  }
  if (dev->arena->contains(host)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                "%s: %s %p is device memory, but this copy expects a host pointer",
                label(rt, device).c_str(), what, host);
  }
  return ANYCHIP_OK;
}

enum class Dir { H2D, D2H, D2D };

AnychipStatus do_copy(Rt rt, int device, Device* dev, Dir dir, void* dst, const void* src,
                      size_t size) {
  if (size == 0) return ANYCHIP_OK;
  const bool dst_dev = dir != Dir::D2H, src_dev = dir != Dir::H2D;
  std::unique_ptr<AccessWindow> wd, ws;
  if (dst_dev) {
    wd = std::make_unique<AccessWindow>(dev->arena.get(), dst, size, "dst");
    CHECK(wd->status());
  } else {
    CHECK(check_host(rt, device, dev, dst, "dst"));
  }
  if (src_dev) {
    ws = std::make_unique<AccessWindow>(dev->arena.get(), src, size, "src");
    CHECK(ws->status());
  } else {
    CHECK(check_host(rt, device, dev, src, "src"));
  }
  std::memmove(dst, src, size);
  return ANYCHIP_OK;
}

// ---- lifecycle -------------------------------------------------------------------------------

AnychipStatus sim_last_error(Rt, char* buf, size_t len) { return anychip::copy_last_error(buf, len); }

AnychipStatus sim_initialize(Rt rt) {
  if (rt->initialized) return ANYCHIP_OK;
  rt->devices.clear();
  for (uint64_t i = 0; i < rt->device_count; ++i) {
    auto dev = std::make_unique<Device>();
    dev->arena = std::make_unique<Arena>(label(rt, static_cast<int>(i)), rt->capacity,
                                         rt->alignment, rt->checking);
    CHECK(dev->arena->reserve());
    rt->devices.push_back(std::move(dev));
  }
  rt->initialized = true;
  return ANYCHIP_OK;
}

AnychipStatus sim_finalize(Rt rt) {
  for (auto& dev : rt->devices) {
    std::lock_guard<std::mutex> lock(dev->mu);
    for (AnychipStream_st* s : dev->streams) delete s;  // drains each stream
    for (AnychipEvent_st* e : dev->events) delete e;
    dev->streams.clear();
    dev->events.clear();
  }
  rt->devices.clear();
  rt->initialized = false;
  return ANYCHIP_OK;
}

AnychipStatus sim_get_device_count(Rt rt, size_t* count) {
  if (count == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "count is NULL");
  *count = rt->device_count;
  return ANYCHIP_OK;
}

AnychipStatus sim_get_device_list(Rt rt, size_t* ids, size_t count) {
  if (ids == nullptr || count > rt->device_count) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: get_device_list wants %zu ids, has %llu",
                rt->name.c_str(), count, static_cast<unsigned long long>(rt->device_count));
  }
  for (size_t i = 0; i < count; ++i) ids[i] = i;
  return ANYCHIP_OK;
}

AnychipStatus sim_noop_device(Rt rt, int device) {
  GET_DEV(rt, device, dev);
  (void)dev;
  return ANYCHIP_OK;
}

// The current device is per thread and per runtime, as cudaSetDevice is per thread.
thread_local std::unordered_map<Rt, int> t_current;

AnychipStatus sim_set_device(Rt rt, int device) {
  GET_DEV(rt, device, dev);
  (void)dev;
  t_current[rt] = device;
  return ANYCHIP_OK;
}

AnychipStatus sim_get_device(Rt rt, int* device) {
  if (device == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "device is NULL");
  auto it = t_current.find(rt);
  *device = it == t_current.end() ? 0 : it->second;
  return ANYCHIP_OK;
}

// ---- memory ----------------------------------------------------------------------------------

AnychipStatus sim_device_allocate(Rt rt, int device, void** ptr, size_t size) {
  GET_DEV(rt, device, dev);
  return dev->arena->allocate(size, ptr);
}

AnychipStatus sim_device_free(Rt rt, int device, void* ptr) {
  GET_DEV(rt, device, dev);
  wait_streams(dev);  // like cudaFree: the memory may still be in use by enqueued copies
  return dev->arena->release(ptr);
}

AnychipStatus sim_host_allocate(Rt rt, int device, void** ptr, size_t size) {
  GET_DEV(rt, device, dev);
  (void)dev;
  if (ptr == nullptr || size == 0) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: host_allocate needs ptr and size > 0",
                label(rt, device).c_str());
  }
  *ptr = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (*ptr == nullptr) {
    return fail(ANYCHIP_ERROR_OUT_OF_MEMORY, "%s: host out of memory for %zu bytes",
                label(rt, device).c_str(), size);
  }
  return ANYCHIP_OK;
}

AnychipStatus sim_host_free(Rt rt, int device, void* ptr) {
  GET_DEV(rt, device, dev);
  (void)dev;
  std::free(ptr);
  return ANYCHIP_OK;
}

AnychipStatus sim_memset(Rt rt, int device, void* ptr, int value, size_t size) {
  GET_DEV(rt, device, dev);
  if (size == 0) return ANYCHIP_OK;
  wait_streams(dev);
  AccessWindow w(dev->arena.get(), ptr, size, "ptr");
  CHECK(w.status());
  std::memset(ptr, value, size);
  return ANYCHIP_OK;
}

template <Dir D>
AnychipStatus sim_copy(Rt rt, int device, void* dst, const void* src, size_t size) {
  GET_DEV(rt, device, dev);
  wait_streams(dev);
  return do_copy(rt, device, dev, D, dst, src, size);
}

template <Dir D>
AnychipStatus sim_copy_async(Rt rt, int device, AnychipStream stream, void* dst, const void* src,
                             size_t size) {
  GET_DEV(rt, device, dev);
  CHECK(check_stream(rt, device, dev, stream));
  // Check the arguments now so the caller gets the error at the call, as a driver would.
  if (size != 0) {
    if (D != Dir::D2H) CHECK(AccessWindow(dev->arena.get(), dst, size, "dst").status());
    if (D != Dir::H2D) CHECK(AccessWindow(dev->arena.get(), src, size, "src").status());
  }
  stream->stream->enqueue([=](AnychipStatus) { return do_copy(rt, device, dev, D, dst, src, size); });
  return ANYCHIP_OK;
}

AnychipStatus sim_memory_stats(Rt rt, int device, AnychipMemoryStats* stats) {
  GET_DEV(rt, device, dev);
  if (stats == nullptr || stats->struct_size < sizeof(AnychipMemoryStats)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "stats is NULL or its struct_size is too small");
  }
  dev->arena->stats(stats);
  return ANYCHIP_OK;
}

// ---- streams ---------------------------------------------------------------------------------

AnychipStatus sim_stream_create(Rt rt, int device, AnychipStream* stream) {
  GET_DEV(rt, device, dev);
  if (stream == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "stream is NULL");
  auto* s = new AnychipStream_st{std::make_shared<anychip::sim::Stream>()};
  std::lock_guard<std::mutex> lock(dev->mu);
  dev->streams.insert(s);
  *stream = s;
  return ANYCHIP_OK;
}

AnychipStatus sim_stream_destroy(Rt rt, int device, AnychipStream stream) {
  GET_DEV(rt, device, dev);
  CHECK(check_stream(rt, device, dev, stream));
  CHECK(check_not_own_work(rt, device, stream, "stream_destroy"));
  {
    std::lock_guard<std::mutex> lock(dev->mu);
    dev->streams.erase(stream);
  }
  delete stream;  // drains the queue first
  return ANYCHIP_OK;
}

AnychipStatus sim_stream_query(Rt rt, int device, AnychipStream stream) {
  GET_DEV(rt, device, dev);
  CHECK(check_stream(rt, device, dev, stream));
  return stream->stream->query();
}

AnychipStatus sim_stream_synchronize(Rt rt, int device, AnychipStream stream) {
  GET_DEV(rt, device, dev);
  CHECK(check_stream(rt, device, dev, stream));
  CHECK(check_not_own_work(rt, device, stream, "stream_synchronize"));
  std::string message;
  AnychipStatus status = stream->stream->synchronize(&message);
  if (status != ANYCHIP_OK) return fail(status, "%s", message.c_str());
  return ANYCHIP_OK;
}

AnychipStatus sim_stream_add_callback(Rt rt, int device, AnychipStream stream,
                                      AnychipStreamCallback callback, void* user_data) {
  GET_DEV(rt, device, dev);
  CHECK(check_stream(rt, device, dev, stream));
  if (callback == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "callback is NULL");
  stream->stream->enqueue([=](AnychipStatus status) {
    callback(user_data, status);
    return ANYCHIP_OK;
  });
  return ANYCHIP_OK;
}

// ---- host-code kernels -------------------------------------------------------------------------

// The simulated chip's compute: host code on the stream's worker thread. In checking mode only
// the listed ranges are opened, so a kernel that strays outside its tensors crashes in tests.
AnychipStatus sim_launch_host_function(Rt rt, int device, AnychipStream stream,
                                       AnychipHostFunction fn, void* user_data,
                                       const AnychipMemoryRange* ranges, int num_ranges) {
  GET_DEV(rt, device, dev);
  CHECK(check_stream(rt, device, dev, stream));
  if (fn == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "fn is NULL");
  if (num_ranges < 0 || (num_ranges > 0 && ranges == nullptr)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "ranges is NULL or num_ranges < 0");
  }
  std::vector<AnychipMemoryRange> list(ranges, ranges + num_ranges);
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].size == 0) continue;
    std::string what = "ranges[" + std::to_string(i) + "]";
    CHECK(AccessWindow(dev->arena.get(), list[i].ptr, list[i].size, what.c_str()).status());
  }
  stream->stream->enqueue([=](AnychipStatus) {
    std::vector<std::unique_ptr<AccessWindow>> windows;
    for (const AnychipMemoryRange& r : list) {
      if (r.size == 0) continue;
      windows.push_back(std::make_unique<AccessWindow>(dev->arena.get(), r.ptr, r.size, "range"));
      if (windows.back()->status() != ANYCHIP_OK) return windows.back()->status();
    }
    AnychipStatus status = fn(user_data);
    if (status != ANYCHIP_OK) return fail(status, "host function %p failed", reinterpret_cast<void*>(fn));
    return ANYCHIP_OK;
  });
  return ANYCHIP_OK;
}

// ---- events ----------------------------------------------------------------------------------

AnychipStatus sim_event_create(Rt rt, int device, AnychipEvent* event) {
  GET_DEV(rt, device, dev);
  if (event == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "event is NULL");
  auto* e = new AnychipEvent_st{std::make_shared<anychip::sim::Event>()};
  std::lock_guard<std::mutex> lock(dev->mu);
  dev->events.insert(e);
  *event = e;
  return ANYCHIP_OK;
}

AnychipStatus sim_event_record(Rt rt, int device, AnychipStream stream, AnychipEvent event) {
  GET_DEV(rt, device, dev);
  CHECK(check_stream(rt, device, dev, stream));
  CHECK(check_event(rt, device, dev, event));
  std::shared_ptr<anychip::sim::Event> ev = event->event;
  uint64_t generation = ev->begin_record();
  anychip::sim::Stream* s = stream->stream.get();  // lives until its queue is drained
  stream->stream->enqueue([ev, generation, s](AnychipStatus status) {
    ev->complete(generation, status, status == ANYCHIP_OK ? std::string() : s->error_message());
    return ANYCHIP_OK;
  });
  return ANYCHIP_OK;
}

AnychipStatus sim_event_query(Rt rt, int device, AnychipEvent event) {
  GET_DEV(rt, device, dev);
  CHECK(check_event(rt, device, dev, event));
  auto& ev = event->event;
  if (!ev->done(ev->last_recorded())) return ANYCHIP_ERROR_NOT_READY;
  std::string message;
  AnychipStatus status = ev->status(&message);
  if (status != ANYCHIP_OK) return fail(status, "event recorded after failed work: %s", message.c_str());
  return ANYCHIP_OK;
}

AnychipStatus sim_event_synchronize(Rt rt, int device, AnychipEvent event) {
  GET_DEV(rt, device, dev);
  CHECK(check_event(rt, device, dev, event));
  auto& ev = event->event;
  std::string message;
  AnychipStatus status = ev->wait(ev->last_recorded(), &message);
  if (status != ANYCHIP_OK) return fail(status, "event recorded after failed work: %s", message.c_str());
  return ANYCHIP_OK;
}

AnychipStatus sim_event_destroy(Rt rt, int device, AnychipEvent event) {
  GET_DEV(rt, device, dev);
  CHECK(check_event(rt, device, dev, event));
  {
    std::lock_guard<std::mutex> lock(dev->mu);
    dev->events.erase(event);
  }
  delete event;
  return ANYCHIP_OK;
}

AnychipStatus sim_stream_wait_event(Rt rt, int device, AnychipStream stream, AnychipEvent event) {
  GET_DEV(rt, device, dev);
  CHECK(check_stream(rt, device, dev, stream));
  CHECK(check_event(rt, device, dev, event));
  std::shared_ptr<anychip::sim::Event> ev = event->event;
  uint64_t generation = ev->last_recorded();  // the record as of this call (device.h)
  stream->stream->enqueue([ev, generation](AnychipStatus) {
    std::string message;
    AnychipStatus status = ev->wait(generation, &message);
    if (status != ANYCHIP_OK) return fail(status, "%s", message.c_str());  // the waited-for failure, as this stream's
    return ANYCHIP_OK;
  });
  return ANYCHIP_OK;
}

AnychipStatus sim_event_elapsed_ms(Rt rt, int device, AnychipEvent start, AnychipEvent end,
                                   float* ms) {
  GET_DEV(rt, device, dev);
  CHECK(check_event(rt, device, dev, start));
  CHECK(check_event(rt, device, dev, end));
  if (ms == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "ms is NULL");
  for (AnychipEvent e : {start, end}) {
    if (e->event->last_recorded() == 0 || !e->event->done(e->event->last_recorded())) {
      return fail(ANYCHIP_ERROR_NOT_READY, "%s: event %p has no completed record",
                  label(rt, device).c_str(), static_cast<void*>(e));
    }
  }
  auto delta = end->event->completed_at() - start->event->completed_at();
  *ms = std::chrono::duration<float, std::milli>(delta).count();
  return ANYCHIP_OK;
}

// ---- device ----------------------------------------------------------------------------------

AnychipStatus sim_synchronize_device(Rt rt, int device) {
  GET_DEV(rt, device, dev);
  AnychipStatus first = ANYCHIP_OK;
  std::string first_message;
  for (const auto& s : other_streams(dev)) {
    std::string message;
    AnychipStatus status = s->synchronize(&message);
    if (status != ANYCHIP_OK && first == ANYCHIP_OK) {
      first = status;
      first_message = message;
    }
  }
  if (first != ANYCHIP_OK) return fail(first, "%s", first_message.c_str());
  return ANYCHIP_OK;
}

AnychipStatus sim_get_properties(Rt rt, int device, AnychipDeviceProperties* props) {
  GET_DEV(rt, device, dev);
  if (props == nullptr || props->struct_size < sizeof(AnychipDeviceProperties)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "props is NULL or its struct_size is too small");
  }
  std::snprintf(props->name, sizeof(props->name), "%s%s", rt->model.c_str(),
                rt->simulated ? " (simulated)" : "");
  std::snprintf(props->vendor, sizeof(props->vendor), "%s", rt->vendor.c_str());
  props->total_memory = dev->arena->capacity();
  props->compute_capability = static_cast<int32_t>(rt->cc);
  props->simulated = rt->simulated ? 1 : 0;
  props->runtime_version = 1000;  // the simulator's own version, 1.0
  props->driver_version = 0;
  props->dtypes = rt->dtypes;
  props->min_chunk_size = dev->arena->alignment();
  props->max_alloc_size = dev->arena->capacity();
  return ANYCHIP_OK;
}

AnychipStatus configure(Rt rt, const char* options) {
  anychip::Options opts;
  std::string error;
  if (!opts.parse(options, &error)) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s", error.c_str());
  rt->name = opts.get("name", rt->name);
  rt->model = opts.get("model", rt->model);
  rt->vendor = opts.get("vendor", rt->vendor);
  uint64_t checking = 0, simulated = 1;
  const struct {
    const char* key;
    uint64_t* out;
    uint64_t fallback;
  } numbers[] = {
      {"devices", &rt->device_count, rt->device_count},
      {"capacity", &rt->capacity, rt->capacity},
      {"dtypes", &rt->dtypes, ANYCHIP_DTYPE_BIT(ANYCHIP_DTYPE_FLOAT32)},
      {"cc", &rt->cc, 0},
      {"alignment", &rt->alignment, 256},
      {"checking", &checking, 0},
      {"simulated", &simulated, 1},
  };
  for (const auto& n : numbers) {
    if (!opts.get_u64(n.key, n.fallback, n.out)) {
      return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "options: %s must be an unsigned integer, got '%s'",
                  n.key, opts.get(n.key, "").c_str());
    }
  }
  if (rt->capacity == 0) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "options: capacity must be > 0");
  if (rt->alignment < 256 || (rt->alignment & (rt->alignment - 1)) != 0) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "options: alignment must be a power of two >= 256");
  }
  rt->checking = checking != 0;
  rt->simulated = simulated != 0;
  return ANYCHIP_OK;
}


// ---- collectives (ABI 1.2; the engine is sim/collectives.cc) ----------------------------------

namespace coll = anychip::sim::coll;

struct PendingCollective {
  AnychipStream stream;
  Device* dev;
  coll::Op op;
  std::vector<AnychipMemoryRange> ranges;
};

// Calls between group_start and group_end of this thread, enqueued at the outermost group_end.
thread_local int g_group_depth = 0;
thread_local std::vector<PendingCollective> g_group;

void enqueue_collectives(Device* dev, AnychipStream stream, std::vector<coll::Op> ops,
                         std::vector<AnychipMemoryRange> ranges) {
  stream->stream->enqueue([=](AnychipStatus) {
    std::vector<std::unique_ptr<AccessWindow>> windows;
    for (const AnychipMemoryRange& r : ranges) {
      windows.push_back(std::make_unique<AccessWindow>(dev->arena.get(), r.ptr, r.size, "buffer"));
      if (windows.back()->status() != ANYCHIP_OK) return windows.back()->status();
    }
    return coll::run(ops);
  });
}

AnychipStatus sim_comm_get_unique_id_size(Rt, size_t* size) {
  if (size == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "comm_get_unique_id_size: size is NULL");
  *size = coll::kIdBytes;
  return ANYCHIP_OK;
}

AnychipStatus sim_comm_get_unique_id(Rt, void* id, size_t size) { return coll::make_unique_id(id, size); }

AnychipStatus sim_comm_init_rank(Rt rt, int device, const void* id, size_t id_size, int rank,
                                 int nranks, AnychipComm* comm) {
  GET_DEV(rt, device, dev);
  (void)dev;
  if (comm == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "comm_init_rank: comm is NULL");
  coll::Comm* c = nullptr;
  CHECK(coll::open(id, id_size, rank, nranks, label(rt, device), &c));
  auto* handle = new AnychipComm_st{rt, device, c};
  std::lock_guard<std::mutex> lock(rt->comm_mu);
  rt->comms.insert(handle);
  *comm = handle;
  return ANYCHIP_OK;
}

AnychipStatus check_comm(Rt rt, AnychipComm comm, const char* what) {
  if (rt == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: runtime is NULL", what);
  std::lock_guard<std::mutex> lock(rt->comm_mu);
  if (comm == nullptr || !rt->comms.count(comm)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: comm %p is not a live communicator of %s",
                what, static_cast<void*>(comm), rt->name.c_str());
  }
  return ANYCHIP_OK;
}

AnychipStatus sim_comm_destroy(Rt rt, AnychipComm comm) {
  CHECK(check_comm(rt, comm, "comm_destroy"));
  GET_DEV(rt, comm->device, dev);
  wait_streams(dev);  // the communicator's enqueued work runs first
  {
    std::lock_guard<std::mutex> lock(rt->comm_mu);
    rt->comms.erase(comm);
  }
  coll::close(comm->comm);
  delete comm;
  return ANYCHIP_OK;
}

// Checks a collective's arguments at the call (as a driver would) and enqueues it, or keeps it
// for group_end. `buffers` are (pointer, elements, name) of the device memory it touches.
struct Buf {
  const void* ptr;
  size_t elements;
  const char* name;
};

AnychipStatus submit(Rt rt, AnychipComm comm, AnychipStream stream, coll::Op op,
                     std::initializer_list<Buf> buffers) {
  const char* what = coll::kind_name(op.kind);
  CHECK(check_comm(rt, comm, what));
  GET_DEV(rt, comm->device, dev);
  std::string where = label(rt, comm->device) + ": " + what;
  CHECK(check_stream(rt, comm->device, dev, stream));
  size_t es = coll::dtype_size(op.dtype);
  if (es == 0 || !(rt->dtypes & ANYCHIP_DTYPE_BIT(op.dtype))) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: dtype %d is not a dtype this device declares",
                where.c_str(), static_cast<int>(op.dtype));
  }
  bool reduces = op.kind == coll::Kind::AllReduce || op.kind == coll::Kind::Reduce ||
                 op.kind == coll::Kind::ReduceScatter;
  if (reduces && !coll::op_valid(op.dtype, op.op)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: op %d is not a reduction on dtype %d (sum, prod, "
                "max, min, avg; avg is not defined on bool)", where.c_str(), static_cast<int>(op.op),
                static_cast<int>(op.dtype));
  }
  int n = coll::nranks_of(comm->comm);
  bool rooted = op.kind == coll::Kind::Broadcast || op.kind == coll::Kind::Reduce ||
                op.kind == coll::Kind::Send || op.kind == coll::Kind::Recv;
  if (rooted && (op.root < 0 || op.root >= n)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: %s must be a rank in 0..%d, got %d",
                where.c_str(), op.kind == coll::Kind::Send || op.kind == coll::Kind::Recv ? "peer" : "root",
                n - 1, op.root);
  }
  op.comm = comm->comm;
  std::vector<AnychipMemoryRange> ranges;
  for (const Buf& b : buffers) {
    if (b.elements == 0) continue;
    if (b.elements > SIZE_MAX / es) {
      return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: %s: count too large", where.c_str(), b.name);
    }
    std::string name = std::string(what) + " " + b.name;
    CHECK(AccessWindow(dev->arena.get(), b.ptr, b.elements * es, name.c_str()).status());
    ranges.push_back(AnychipMemoryRange{b.ptr, b.elements * es});
  }
  if (g_group_depth > 0) {
    g_group.push_back(PendingCollective{stream, dev, op, std::move(ranges)});
  } else {
    enqueue_collectives(dev, stream, {op}, std::move(ranges));
  }
  return ANYCHIP_OK;
}

coll::Op make_op(coll::Kind kind, const void* send, void* recv, size_t count, AnychipDtype dtype,
                 AnychipReduceOp op = ANYCHIP_REDUCE_SUM, int root = 0) {
  return coll::Op{kind, nullptr, send, recv, count, dtype, op, root};
}

size_t ranks(Rt rt, AnychipComm comm) {
  std::lock_guard<std::mutex> lock(rt->comm_mu);
  return rt->comms.count(comm) ? static_cast<size_t>(coll::nranks_of(comm->comm)) : 1;
}

int rank(Rt rt, AnychipComm comm) {
  std::lock_guard<std::mutex> lock(rt->comm_mu);
  return rt->comms.count(comm) ? coll::rank_of(comm->comm) : 0;
}

AnychipStatus sim_all_reduce(Rt rt, const void* send, void* recv, size_t count, AnychipDtype dtype,
                             AnychipReduceOp op, AnychipComm comm, AnychipStream stream) {
  return submit(rt, comm, stream, make_op(coll::Kind::AllReduce, send, recv, count, dtype, op),
                {{send, count, "send"}, {recv, count, "recv"}});
}

AnychipStatus sim_broadcast(Rt rt, const void* send, void* recv, size_t count, AnychipDtype dtype,
                            int root, AnychipComm comm, AnychipStream stream) {
  bool is_root = rank(rt, comm) == root;
  return submit(rt, comm, stream,
                make_op(coll::Kind::Broadcast, send, recv, count, dtype, ANYCHIP_REDUCE_SUM, root),
                {{send, is_root ? count : 0, "send"}, {recv, count, "recv"}});
}

AnychipStatus sim_reduce(Rt rt, const void* send, void* recv, size_t count, AnychipDtype dtype,
                         AnychipReduceOp op, int root, AnychipComm comm, AnychipStream stream) {
  bool is_root = rank(rt, comm) == root;
  return submit(rt, comm, stream, make_op(coll::Kind::Reduce, send, recv, count, dtype, op, root),
                {{send, count, "send"}, {recv, is_root ? count : 0, "recv"}});
}

AnychipStatus sim_all_gather(Rt rt, const void* send, void* recv, size_t count, AnychipDtype dtype,
                             AnychipComm comm, AnychipStream stream) {
  return submit(rt, comm, stream, make_op(coll::Kind::AllGather, send, recv, count, dtype),
                {{send, count, "send"}, {recv, count * ranks(rt, comm), "recv"}});
}

AnychipStatus sim_reduce_scatter(Rt rt, const void* send, void* recv, size_t count,
                                 AnychipDtype dtype, AnychipReduceOp op, AnychipComm comm,
                                 AnychipStream stream) {
  return submit(rt, comm, stream, make_op(coll::Kind::ReduceScatter, send, recv, count, dtype, op),
                {{send, count * ranks(rt, comm), "send"}, {recv, count, "recv"}});
}

AnychipStatus sim_all_to_all(Rt rt, const void* send, void* recv, size_t count, AnychipDtype dtype,
                             AnychipComm comm, AnychipStream stream) {
  size_t n = ranks(rt, comm);
  return submit(rt, comm, stream, make_op(coll::Kind::AllToAll, send, recv, count, dtype),
                {{send, count * n, "send"}, {recv, count * n, "recv"}});
}

AnychipStatus sim_send(Rt rt, const void* buf, size_t count, AnychipDtype dtype, int peer,
                       AnychipComm comm, AnychipStream stream) {
  return submit(rt, comm, stream,
                make_op(coll::Kind::Send, buf, nullptr, count, dtype, ANYCHIP_REDUCE_SUM, peer),
                {{buf, count, "buf"}});
}

AnychipStatus sim_recv(Rt rt, void* buf, size_t count, AnychipDtype dtype, int peer,
                       AnychipComm comm, AnychipStream stream) {
  return submit(rt, comm, stream,
                make_op(coll::Kind::Recv, nullptr, buf, count, dtype, ANYCHIP_REDUCE_SUM, peer),
                {{buf, count, "buf"}});
}

AnychipStatus sim_group_start(Rt) {
  ++g_group_depth;
  return ANYCHIP_OK;
}

AnychipStatus sim_group_end(Rt) {
  if (g_group_depth == 0) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "group_end without group_start");
  if (--g_group_depth > 0) return ANYCHIP_OK;
  std::vector<PendingCollective> pending;
  pending.swap(g_group);
  // One work item per stream, in call order: its sends and recvs progress together.
  std::vector<AnychipStream> order;
  for (const auto& p : pending) {
    if (std::find(order.begin(), order.end(), p.stream) == order.end()) order.push_back(p.stream);
  }
  for (AnychipStream stream : order) {
    std::vector<coll::Op> ops;
    std::vector<AnychipMemoryRange> ranges;
    Device* dev = nullptr;
    for (const auto& p : pending) {
      if (p.stream != stream) continue;
      dev = p.dev;
      ops.push_back(p.op);
      ranges.insert(ranges.end(), p.ranges.begin(), p.ranges.end());
    }
    enqueue_collectives(dev, stream, std::move(ops), std::move(ranges));
  }
  return ANYCHIP_OK;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) AnychipStatus anychip_device_init(
    AnychipDeviceInterface* iface, const char* options) {
  if (iface == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "iface is NULL");
  if (iface->struct_size < offsetof(AnychipDeviceInterface, reserved)) {
    return fail(ANYCHIP_ERROR_UNSUPPORTED,
                "caller's AnychipDeviceInterface is %zu bytes, the simulator needs %zu",
                iface->struct_size, offsetof(AnychipDeviceInterface, reserved));
  }
  iface->last_error = sim_last_error;
  auto rt = std::make_unique<AnychipRuntime_st>();
  CHECK(configure(rt.get(), options));
  iface->abi_version = ANYCHIP_DEVICE_ABI_VERSION;
  iface->initialize = sim_initialize;
  iface->finalize = sim_finalize;
  iface->get_device_count = sim_get_device_count;
  iface->get_device_list = sim_get_device_list;
  iface->init_device = sim_noop_device;
  iface->deinit_device = sim_noop_device;
  iface->set_device = sim_set_device;
  iface->get_device = sim_get_device;
  iface->device_allocate = sim_device_allocate;
  iface->device_free = sim_device_free;
  iface->host_allocate = sim_host_allocate;
  iface->host_free = sim_host_free;
  iface->memset = sim_memset;
  iface->memcpy_h2d = sim_copy<Dir::H2D>;
  iface->memcpy_d2h = sim_copy<Dir::D2H>;
  iface->memcpy_d2d = sim_copy<Dir::D2D>;
  iface->memcpy_h2d_async = sim_copy_async<Dir::H2D>;
  iface->memcpy_d2h_async = sim_copy_async<Dir::D2H>;
  iface->memcpy_d2d_async = sim_copy_async<Dir::D2D>;
  iface->memory_stats = sim_memory_stats;
  iface->stream_create = sim_stream_create;
  iface->stream_destroy = sim_stream_destroy;
  iface->stream_query = sim_stream_query;
  iface->stream_synchronize = sim_stream_synchronize;
  iface->stream_add_callback = sim_stream_add_callback;
  iface->event_create = sim_event_create;
  iface->event_record = sim_event_record;
  iface->event_query = sim_event_query;
  iface->event_synchronize = sim_event_synchronize;
  iface->event_destroy = sim_event_destroy;
  iface->stream_wait_event = sim_stream_wait_event;
  iface->event_elapsed_ms = sim_event_elapsed_ms;
  iface->synchronize_device = sim_synchronize_device;
  iface->get_properties = sim_get_properties;
  iface->launch_host_function = sim_launch_host_function;
  iface->comm_get_unique_id_size = sim_comm_get_unique_id_size;
  iface->comm_get_unique_id = sim_comm_get_unique_id;
  iface->comm_init_rank = sim_comm_init_rank;
  iface->comm_destroy = sim_comm_destroy;
  iface->all_reduce = sim_all_reduce;
  iface->broadcast = sim_broadcast;
  iface->reduce = sim_reduce;
  iface->all_gather = sim_all_gather;
  iface->reduce_scatter = sim_reduce_scatter;
  iface->all_to_all = sim_all_to_all;
  iface->send = sim_send;
  iface->recv = sim_recv;
  iface->group_start = sim_group_start;
  iface->group_end = sim_group_end;
  iface->runtime = rt.release();  // owned by the caller's process for its lifetime
  return ANYCHIP_OK;
}
