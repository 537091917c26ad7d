// The device allocator: PyTorch's storages on the anychip device come from device_allocate.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstdio>

#include "device.h"

namespace anychip::torch_bridge {
namespace {

// What the deleter needs: device_free takes the device, which a bare pointer does not name.
struct Block {
  void* ptr;
  c10::DeviceIndex device;
};

void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  if (g_iface.runtime != nullptr) {
    AnychipStatus status = g_iface.device_free(g_iface.runtime, block->device, block->ptr);
    if (status != ANYCHIP_OK) {  // a deleter cannot throw: say so instead of losing it
      char message[512] = "";
      g_iface.last_error(g_iface.runtime, message, sizeof(message));
      std::fprintf(stderr, "anychip:%s device_free failed: %s\n", g_name.c_str(), message);
    }
  }
  delete block;
}

struct DeviceAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = current_device();
    check_device(device);
    c10::Device where(c10::DeviceType::PrivateUse1, device);
    if (nbytes == 0) return {nullptr, nullptr, &c10::detail::deleteNothing, where};
    void* ptr = nullptr;
    ANYCHIP_CALL(device_allocate, device, &ptr, nbytes);
    return {ptr, new Block{ptr, device}, &free_block, where};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) ANYCHIP_CALL(memcpy_d2d, current_device(), dest, src, count);
  }
};

DeviceAllocator g_allocator;

}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

}  // namespace anychip::torch_bridge
