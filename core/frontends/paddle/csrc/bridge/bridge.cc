// The Paddle bridge: presents any anychip device table to Paddle as a CustomDevice.
//
// This is the only anychip source that includes a Paddle header. Paddle dlopen()s every .so in
// $CUSTOM_DEVICE_ROOT at `import paddle` and calls its InitPlugin. anychip puts one copy of this
// library per device there (copies, not links: the loader would share one instance between
// links), each next to a config file named after it, "<library>.conf":
//   paddle_type=anychip_ascend      device type Paddle registers (avoids names Paddle special-cases)
//   sub_type=simulated              shown by Paddle as the sub-device type
//   library=/path/libanychip_sim.so the plugin's runtime library
//   symbol=anychip_device_init      its entry point
//   options=name=npu;devices=2;...  passed to the entry point
// and, in the folder's kernels/ subfolder, the device's Paddle kernels (load_kernels).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include "bridge.h"

namespace anychip::bridge {

AnychipDeviceInterface g_iface;
std::string g_name = "anychip";

// Paddle reports most failures without the plugin's reason; print it so users see why. Once:
// Paddle polls events, and a failure that every later query repeats (a collective whose peer
// never came) would otherwise fill the terminal.
C_Status report(AnychipStatus status, const char* what) {
  if (status == ANYCHIP_OK) return C_SUCCESS;
  if (status == ANYCHIP_ERROR_NOT_READY) return C_FAILED;
  char message[512] = "";
  if (g_iface.last_error != nullptr) g_iface.last_error(g_iface.runtime, message, sizeof(message));
  std::string line = "anychip[" + g_name + "] " + what + " failed: " + message + "\n";
  static std::mutex mu;
  static std::string last;
  std::lock_guard<std::mutex> lock(mu);
  if (line != last) std::fputs(line.c_str(), stderr);
  last = line;
  return status == ANYCHIP_ERROR_OUT_OF_MEMORY ? C_FAILED : C_ERROR;
}

C_Status refuse(const char* what, const std::string& why) {
  std::fprintf(stderr, "anychip[%s] %s refused: %s\n", g_name.c_str(), what, why.c_str());
  return C_ERROR;
}

}  // namespace anychip::bridge

namespace {

using namespace anychip::bridge;

std::string g_paddle_type, g_sub_type;

C_Status initialize() { return CALL0(initialize); }
C_Status finalize() { return CALL0(finalize); }
C_Status init_device(const C_Device d) {
  return g_iface.init_device ? CALL(init_device, d->id) : C_SUCCESS;
}
C_Status deinit_device(const C_Device d) {
  return g_iface.deinit_device ? CALL(deinit_device, d->id) : C_SUCCESS;
}
C_Status set_device(const C_Device d) { return CALL(set_device, d->id); }
C_Status get_device(const C_Device d) { return CALL(get_device, &d->id); }

C_Status create_stream(const C_Device d, C_Stream* s) {
  return CALL(stream_create, d->id, reinterpret_cast<AnychipStream*>(s));
}
C_Status destroy_stream(const C_Device d, C_Stream s) { return CALL(stream_destroy, d->id, S(s)); }
C_Status query_stream(const C_Device d, C_Stream s) { return CALL(stream_query, d->id, S(s)); }
C_Status synchronize_stream(const C_Device d, C_Stream s) {
  return CALL(stream_synchronize, d->id, S(s));
}

struct CallbackClosure {
  C_Device_st device;
  C_Stream stream;
  C_Callback callback;
  void* user_data;
};

void run_callback(void* user_data, AnychipStatus status) {
  auto* c = static_cast<CallbackClosure*>(user_data);
  C_Status s = status == ANYCHIP_OK ? C_SUCCESS : C_ERROR;
  c->callback(&c->device, c->stream, c->user_data, &s);
  delete c;
}

C_Status stream_add_callback(const C_Device d, C_Stream s, C_Callback cb, void* user_data) {
  auto* c = new CallbackClosure{*d, s, cb, user_data};
  C_Status status = CALL(stream_add_callback, d->id, S(s), run_callback, c);
  if (status != C_SUCCESS) delete c;
  return status;
}

C_Status create_event(const C_Device d, C_Event* e) {
  return CALL(event_create, d->id, reinterpret_cast<AnychipEvent*>(e));
}
C_Status record_event(const C_Device d, C_Stream s, C_Event e) {
  return CALL(event_record, d->id, S(s), E(e));
}
C_Status destroy_event(const C_Device d, C_Event e) { return CALL(event_destroy, d->id, E(e)); }
C_Status query_event(const C_Device d, C_Event e) { return CALL(event_query, d->id, E(e)); }
C_Status synchronize_event(const C_Device d, C_Event e) {
  return CALL(event_synchronize, d->id, E(e));
}
C_Status stream_wait_event(const C_Device d, C_Stream s, C_Event e) {
  return CALL(stream_wait_event, d->id, S(s), E(e));
}
C_Status synchronize_device(const C_Device d) { return CALL(synchronize_device, d->id); }

C_Status device_allocate(const C_Device d, void** ptr, size_t size) {
  return CALL(device_allocate, d->id, ptr, size);
}
C_Status device_deallocate(const C_Device d, void* ptr, size_t) {
  return CALL(device_free, d->id, ptr);
}
C_Status device_memory_set(const C_Device d, void* ptr, unsigned char value, size_t size) {
  return CALL(memset, d->id, ptr, value, size);
}
C_Status host_allocate(const C_Device d, void** ptr, size_t size) {
  return CALL(host_allocate, d->id, ptr, size);
}
C_Status host_deallocate(const C_Device d, void* ptr, size_t) {
  return CALL(host_free, d->id, ptr);
}

C_Status copy_h2d(const C_Device d, void* dst, const void* src, size_t n) {
  return CALL(memcpy_h2d, d->id, dst, src, n);
}
C_Status copy_d2h(const C_Device d, void* dst, const void* src, size_t n) {
  return CALL(memcpy_d2h, d->id, dst, src, n);
}
C_Status copy_d2d(const C_Device d, void* dst, const void* src, size_t n) {
  return CALL(memcpy_d2d, d->id, dst, src, n);
}
C_Status async_h2d(const C_Device d, C_Stream s, void* dst, const void* src, size_t n) {
  return CALL(memcpy_h2d_async, d->id, S(s), dst, src, n);
}
C_Status async_d2h(const C_Device d, C_Stream s, void* dst, const void* src, size_t n) {
  return CALL(memcpy_d2h_async, d->id, S(s), dst, src, n);
}
C_Status async_d2d(const C_Device d, C_Stream s, void* dst, const void* src, size_t n) {
  return CALL(memcpy_d2d_async, d->id, S(s), dst, src, n);
}

C_Status get_device_count(size_t* count) { return CALL(get_device_count, count); }
C_Status get_device_list(size_t* ids) {
  size_t count = 0;
  if (C_Status s = CALL(get_device_count, &count)) return s;
  if (g_iface.get_device_list != nullptr) return CALL(get_device_list, ids, count);
  for (size_t i = 0; i < count; ++i) ids[i] = i;
  return C_SUCCESS;
}

C_Status memory_stats(const C_Device d, size_t* total, size_t* free) {
  AnychipMemoryStats stats{};
  stats.struct_size = sizeof(stats);
  if (C_Status s = CALL(memory_stats, d->id, &stats)) return s;
  *total = stats.total_bytes;
  *free = stats.free_bytes;
  return C_SUCCESS;
}

C_Status properties(const C_Device d, AnychipDeviceProperties* p) {
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(*p);
  return CALL(get_properties, d->id, p);
}

// Paddle asks for each property separately; all come from one get_properties call.
template <typename T, typename Field>
C_Status property(const C_Device d, T* out, Field field) {
  AnychipDeviceProperties p;
  if (C_Status s = properties(d, &p)) return s;
  *out = static_cast<T>(field(p));
  return C_SUCCESS;
}

using Props = const AnychipDeviceProperties&;

C_Status min_chunk_size(const C_Device d, size_t* out) {
  return property(d, out, [](Props p) { return p.min_chunk_size; });
}
C_Status max_alloc_size(const C_Device d, size_t* out) {
  return property(d, out, [](Props p) { return p.max_alloc_size; });
}
C_Status compute_capability(const C_Device d, size_t* out) {
  return property(d, out, [](Props p) { return p.compute_capability; });
}
C_Status runtime_version(const C_Device d, size_t* out) {
  return property(d, out, [](Props p) { return p.runtime_version; });
}
C_Status driver_version(const C_Device d, size_t* out) {
  return property(d, out, [](Props p) { return p.driver_version; });
}
C_Status fp16_supported(const C_Device d, bool* out) {
  return property(d, out, [](Props p) { return (p.dtypes >> ANYCHIP_DTYPE_FLOAT16) & 1; });
}
C_Status bf16_supported(const C_Device d, bool* out) {
  return property(d, out, [](Props p) { return (p.dtypes >> ANYCHIP_DTYPE_BFLOAT16) & 1; });
}

// The config sits next to this very file, so each copy finds its own device.
bool read_config(std::map<std::string, std::string>* config, std::string* error) {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&read_config), &info) == 0 || info.dli_fname == nullptr) {
    *error = "cannot find the bridge's own path";
    return false;
  }
  std::string path = std::string(info.dli_fname) + ".conf";
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read " + path;
    return false;
  }
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) (*config)[line.substr(0, eq)] = line.substr(eq + 1);
  }
  for (const char* key : {"paddle_type", "library", "symbol"}) {
    if (config->count(key) == 0) {
      *error = path + " lacks '" + key + "'";
      return false;
    }
  }
  return true;
}

bool load_device(std::string* error) {
  std::map<std::string, std::string> config;
  if (!read_config(&config, error)) return false;
  g_name = config["name"].empty() ? config["paddle_type"] : config["name"];
  g_paddle_type = config["paddle_type"];
  g_sub_type = config["sub_type"];
  void* lib = dlopen(config["library"].c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *error = std::string("cannot load ") + config["library"] + ": " + dlerror();
    return false;
  }
  auto init = reinterpret_cast<AnychipDeviceInitFn>(dlsym(lib, config["symbol"].c_str()));
  if (init == nullptr) {
    *error = config["library"] + " has no symbol " + config["symbol"];
    return false;
  }
  std::memset(&g_iface, 0, sizeof(g_iface));
  g_iface.struct_size = sizeof(g_iface);
  AnychipStatus status = init(&g_iface, config["options"].c_str());
  if (status != ANYCHIP_OK || (g_iface.abi_version >> 16) != ANYCHIP_DEVICE_ABI_MAJOR) {
    char message[512] = "ABI major version mismatch";
    if (status != ANYCHIP_OK && g_iface.last_error != nullptr) {
      g_iface.last_error(g_iface.runtime, message, sizeof(message));
    }
    *error = config["symbol"] + " failed: " + message;
    return false;
  }
  return true;
}

// The device's Paddle kernels: kernels/libanychip_<name>_kernels.so beside this library, if
// there is one (see ../kernels/loader.cc). Loaded here rather than by Paddle from the folder
// itself, because Paddle expects every library it finds there to be a runtime, and warns about
// each that is not. Loaded now, so that its kernels are registered with this device's.
void load_kernels() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&read_config), &info) == 0 || info.dli_fname == nullptr) return;
  std::string self = info.dli_fname;
  std::string path = self.substr(0, self.rfind('/') + 1) + "kernels/libanychip_" + g_name + "_kernels.so";
  if (access(path.c_str(), F_OK) != 0) return;  // a device without base-op kernels
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
    std::fprintf(stderr, "anychip[%s]: no Paddle kernels: cannot load %s: %s\n", g_name.c_str(), path.c_str(),
                 dlerror());
  }
}

}  // namespace

// anychip.ops launches host-code kernels through the copy of this library that Paddle loaded
// for the tensors' device, so they run on the runtime instance that owns the tensors' memory,
// in the order of Paddle's stream. Returns when the kernel has run (the caller's tensors and
// descriptors need to live only for the call); on failure leaves a message in `error`.
extern "C" __attribute__((visibility("default"))) int anychip_bridge_launch(
    int device, void* stream, AnychipHostFunction fn, void* user_data,
    const AnychipMemoryRange* ranges, int num_ranges, char* error, size_t error_size) {
  if (g_iface.launch_host_function == nullptr) {
    std::snprintf(error, error_size, "%s runs no host-code kernels (launch_host_function is NULL)",
                  g_name.c_str());
    return ANYCHIP_ERROR_UNSUPPORTED;
  }
  AnychipStatus status = g_iface.launch_host_function(g_iface.runtime, device, static_cast<AnychipStream>(stream), fn,
                                                       user_data, ranges, num_ranges);
  if (status == ANYCHIP_OK) status = g_iface.stream_synchronize(g_iface.runtime, device, static_cast<AnychipStream>(stream));
  if (status != ANYCHIP_OK && g_iface.last_error != nullptr) {
    g_iface.last_error(g_iface.runtime, error, error_size);
  }
  return status;
}

extern "C" __attribute__((visibility("default"))) void InitPlugin(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
  std::string error;
  if (!load_device(&error)) {
    // Leaving device_type unset makes Paddle skip this library; the others still load.
    std::fprintf(stderr, "anychip: Paddle bridge skipped a device: %s\n", error.c_str());
    return;
  }
  params->device_type = const_cast<char*>(g_paddle_type.c_str());
  params->sub_device_type = const_cast<char*>(g_sub_type.c_str());
  load_kernels();

  C_DeviceInterface* p = params->interface;
  std::memset(reinterpret_cast<char*>(p) + sizeof(p->size), 0, sizeof(*p) - sizeof(p->size));
  p->initialize = initialize;
  p->finalize = finalize;
  p->init_device = init_device;
  p->set_device = set_device;
  p->get_device = get_device;
  p->deinit_device = deinit_device;
  p->create_stream = create_stream;
  p->destroy_stream = destroy_stream;
  p->query_stream = query_stream;
  p->stream_add_callback = stream_add_callback;
  p->create_event = create_event;
  p->record_event = record_event;
  p->destroy_event = destroy_event;
  p->query_event = query_event;
  p->synchronize_device = synchronize_device;
  p->synchronize_stream = synchronize_stream;
  p->synchronize_event = synchronize_event;
  p->stream_wait_event = stream_wait_event;
  p->device_memory_allocate = device_allocate;
  p->device_memory_deallocate = device_deallocate;
  p->device_memory_set = device_memory_set;
  p->host_memory_allocate = host_allocate;
  p->host_memory_deallocate = host_deallocate;
  p->memory_copy_h2d = copy_h2d;
  p->memory_copy_d2h = copy_d2h;
  p->memory_copy_d2d = copy_d2d;
  p->async_memory_copy_h2d = async_h2d;
  p->async_memory_copy_d2h = async_d2h;
  p->async_memory_copy_d2d = async_d2d;
  p->get_device_count = get_device_count;
  p->get_device_list = get_device_list;
  p->device_memory_stats = memory_stats;
  p->device_min_chunk_size = min_chunk_size;
  p->device_max_alloc_size = max_alloc_size;
  p->get_compute_capability = compute_capability;
  p->get_runtime_version = runtime_version;
  p->get_driver_version = driver_version;
  p->is_float16_supported = fp16_supported;
  p->is_bfloat16_supported = bf16_supported;
  anychip::bridge::fill_collectives(p);
}
