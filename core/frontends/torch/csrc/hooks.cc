// PyTorch's PrivateUse1 hooks (torch.accelerator, generators, storage resizing) over device.h.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>

#include <mutex>
#include <vector>

#include "device.h"
#include "storage.h"

namespace anychip::torch_bridge {
namespace {

// The device's random numbers are the host's (anychip's kernel set has no generator): a CPU
// generator that says it belongs to the device, so torch.manual_seed seeds it like any other.
struct Generator final : public at::CPUGeneratorImpl {
  explicit Generator(c10::DeviceIndex device) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, device);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_device_count > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(g_device_count); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex old = current_device();
    set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    if (device < 0 || device >= g_device_count) return current_device();
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    static std::mutex mu;
    static std::vector<at::Generator> generators;
    std::lock_guard<std::mutex> lock(mu);
    if (generators.empty()) {
      for (int i = 0; i < g_device_count; ++i) generators.push_back(at::make_generator<Generator>(i));
    }
    c10::DeviceIndex index = device == -1 ? current_device() : device;
    check_device(index);
    return generators.at(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return at::make_generator<Generator>(device == -1 ? current_device() : device);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_device());
  }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_bytes(storage.unsafeGetStorageImpl(), nbytes);
  }
};

struct Register {
  Register() { at::RegisterPrivateUse1HooksInterface(new Hooks); }
} g_register;

}  // namespace
}  // namespace anychip::torch_bridge
