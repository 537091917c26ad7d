// The simulator's device memory: one reserved address range carved up by a best-fit allocator.
//
// In checking mode the whole range is PROT_NONE, and a region becomes readable only while the
// runtime itself is copying through it (AccessWindow). Host code that reads or writes device
// memory behind the runtime's back therefore dies with SIGSEGV in tests instead of silently
// working on a simulator and failing on real hardware.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "anychip/device.h"

namespace anychip::sim {

class Arena {
 public:
  // `label` names the device in messages ("npu:0"). Capacity is rounded up to whole pages.
  Arena(std::string label, uint64_t capacity, uint64_t alignment, bool checking);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Fails with a message when the address range could not be reserved.
  AnychipStatus reserve();

  AnychipStatus allocate(size_t size, void** out);
  AnychipStatus release(void* ptr);

  // Checks that [ptr, ptr+size) lies inside one live allocation and, in checking mode, makes it
  // accessible until the matching close(). `what` names the argument in error messages.
  AnychipStatus open(const void* ptr, size_t size, const char* what);
  void close(const void* ptr);

  bool contains(const void* ptr) const {
    return static_cast<const char*>(ptr) >= base_ && static_cast<const char*>(ptr) < base_ + capacity_;
  }
  void stats(AnychipMemoryStats* out);
  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }

 private:
  struct Block {
    uint64_t size;
    uint32_t open_count;
  };
  // Returns the live block holding `offset`, or live_.end().
  std::map<uint64_t, Block>::iterator find_live(uint64_t offset);
  void protect(uint64_t offset, uint64_t size, bool accessible);
  void insert_free(uint64_t offset, uint64_t size);

  const std::string label_;
  uint64_t capacity_;
  const uint64_t alignment_;
  const bool checking_;
  char* base_ = nullptr;

  std::mutex mu_;
  std::map<uint64_t, uint64_t> free_by_offset_;            // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;   // (size, offset), best fit
  std::map<uint64_t, Block> live_;                         // offset -> block
  uint64_t allocated_ = 0, peak_ = 0, total_allocations_ = 0;
};

// RAII access to device memory for the duration of one runtime operation.
class AccessWindow {
 public:
  AccessWindow(Arena* arena, const void* ptr, size_t size, const char* what)
      : arena_(arena), ptr_(ptr), status_(arena->open(ptr, size, what)) {}
  ~AccessWindow() {
    if (status_ == ANYCHIP_OK) arena_->close(ptr_);
  }
  AccessWindow(const AccessWindow&) = delete;
  AccessWindow& operator=(const AccessWindow&) = delete;
  AnychipStatus status() const { return status_; }

 private:
  Arena* arena_;
  const void* ptr_;
  AnychipStatus status_;
};

}  // namespace anychip::sim
