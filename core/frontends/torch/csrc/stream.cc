// Streams, events and the device guard: c10::impl::DeviceGuardImplInterface over device.h.
#include "stream.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <mutex>
#include <vector>

#include "device.h"

namespace anychip::torch_bridge {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;
constexpr size_t kPoolSize = 8;  // getStreamFromGlobalPool cycles through this many streams

std::mutex g_streams_mu;
std::array<std::vector<AnychipStream>, kMaxDevices> g_streams;  // [device][id]; never destroyed
std::array<size_t, kMaxDevices> g_pool_next{};
thread_local std::array<c10::StreamId, kMaxDevices> t_current{};  // all 0: the default stream

c10::Stream make_stream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, device), id);
}

// Creates streams of `device` until id `id` exists; returns its handle.
AnychipStream ensure_stream(c10::DeviceIndex device, size_t id) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_streams_mu);
  auto& streams = g_streams.at(device);
  while (streams.size() <= id) {
    AnychipStream s = nullptr;
    ANYCHIP_CALL(stream_create, device, &s);
    streams.push_back(s);
  }
  return streams[id];
}

c10::StreamId new_stream_id(c10::DeviceIndex device) {
  ensure_stream(device, 0);
  std::lock_guard<std::mutex> lock(g_streams_mu);
  AnychipStream s = nullptr;
  ANYCHIP_CALL(stream_create, device, &s);
  g_streams.at(device).push_back(s);
  return static_cast<c10::StreamId>(g_streams[device].size() - 1);
}

// An event as PyTorch holds it: created on the device of its first record.
struct Event {
  AnychipEvent handle = nullptr;
  c10::DeviceIndex device = -1;
};

// A c10::Device without an index (torch.Stream(device="anychip")) means the current device.
c10::DeviceIndex index_of(c10::Device d) { return d.has_index() && d.index() >= 0 ? d.index() : current_device(); }

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      set_current_device(d.index());
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device d) const override {
    c10::DeviceIndex i = index_of(d);
    return make_stream(i, t_current.at(i));
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return make_stream(index_of(d), 0); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    c10::DeviceIndex i = index_of(d);
    return make_stream(i, new_stream_id(i));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    c10::DeviceIndex i = index_of(d);
    size_t slot;
    {
      std::lock_guard<std::mutex> lock(g_streams_mu);
      slot = 1 + g_pool_next.at(i)++ % kPoolSize;
    }
    ensure_stream(i, slot);
    return make_stream(i, static_cast<c10::StreamId>(slot));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getStream(s.device());
    stream_handle(s);  // validates it
    t_current.at(s.device_index()) = s.id();
    return old;
  }
  void* getStreamNativeHandle(const c10::Stream s) const override { return stream_handle(s); }

  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(g_device_count); }

  bool queryStream(const c10::Stream& s) const override {
    AnychipStatus status = g_iface.stream_query(g_iface.runtime, s.device_index(), stream_handle(s));
    if (status == ANYCHIP_ERROR_NOT_READY) return false;
    check(status, "stream_query");
    return true;
  }
  void synchronizeStream(const c10::Stream& s) const override {
    ANYCHIP_CALL(stream_synchronize, s.device_index(), stream_handle(s));
  }
  void synchronizeDevice(const c10::DeviceIndex device) const override {
    c10::DeviceIndex i = device < 0 ? current_device() : device;
    check_device(i);
    ANYCHIP_CALL(synchronize_device, i);
  }

  void record(void** event, const c10::Stream& s, const c10::DeviceIndex device, const c10::EventFlag) const override {
    TORCH_CHECK(device == -1 || device == s.device_index(), "anychip event: recording on stream of device ",
                static_cast<int>(s.device_index()), " with device index ", static_cast<int>(device));
    auto* e = static_cast<Event*>(*event);
    if (e == nullptr) {
      e = new Event;
      *event = e;
    }
    TORCH_CHECK(e->device == -1 || e->device == s.device_index(), "anychip event created on device ",
                static_cast<int>(e->device), " recorded on a stream of device ", static_cast<int>(s.device_index()));
    if (e->handle == nullptr) {
      ANYCHIP_CALL(event_create, s.device_index(), &e->handle);
      e->device = s.device_index();
    }
    ANYCHIP_CALL(event_record, s.device_index(), stream_handle(s), e->handle);
  }
  void block(void* event, const c10::Stream& s) const override {
    auto* e = static_cast<Event*>(event);
    if (e == nullptr || e->handle == nullptr) return;  // never recorded: nothing to wait for
    ANYCHIP_CALL(stream_wait_event, s.device_index(), stream_handle(s), e->handle);
  }
  bool queryEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    if (e == nullptr || e->handle == nullptr) return true;
    AnychipStatus status = g_iface.event_query(g_iface.runtime, e->device, e->handle);
    if (status == ANYCHIP_ERROR_NOT_READY) return false;
    check(status, "event_query");
    return true;
  }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    if (e == nullptr || e->handle == nullptr) return;
    ANYCHIP_CALL(event_synchronize, e->device, e->handle);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a && b && a->handle && b->handle, "anychip elapsed_time: both events must have been recorded");
    TORCH_CHECK(g_iface.event_elapsed_ms != nullptr, g_name, " does not time events (event_elapsed_ms is NULL)");
    float ms = 0;
    ANYCHIP_CALL(event_elapsed_ms, a->device, a->handle, b->handle, &ms);
    return ms;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    auto* e = static_cast<Event*>(event);
    if (e == nullptr) return;
    if (e->handle != nullptr && g_iface.runtime != nullptr) g_iface.event_destroy(g_iface.runtime, e->device, e->handle);
    delete e;
  }
};

}  // namespace

AnychipStream stream_handle(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kType, "not an anychip stream: ", stream);
  TORCH_CHECK(stream.id() >= 0, "anychip stream id ", stream.id(), " is not a stream of this device");
  {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    auto& streams = g_streams.at(stream.device_index());
    if (static_cast<size_t>(stream.id()) < streams.size()) return streams[stream.id()];
  }
  TORCH_CHECK(stream.id() == 0, "anychip stream id ", stream.id(), " was never created on device ",
              static_cast<int>(stream.device_index()));
  return ensure_stream(stream.device_index(), 0);
}

AnychipStream current_stream_handle(c10::DeviceIndex device) {
  return stream_handle(make_stream(device, t_current.at(device)));
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl)

}  // namespace anychip::torch_bridge
