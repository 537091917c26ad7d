#include "sim/arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/last_error.h"

namespace anychip::sim {

namespace {
uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }
uint64_t page_size() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }
}  // namespace

Arena::Arena(std::string label, uint64_t capacity, uint64_t alignment, bool checking)
    : label_(std::move(label)),
      capacity_(round_up(capacity, page_size())),
      // mprotect works on whole pages, so checking mode gives every allocation its own pages.
      alignment_(checking ? round_up(alignment, page_size()) : alignment),
      checking_(checking) {}

Arena::~Arena() {
  if (base_ != nullptr) munmap(base_, capacity_);
}

AnychipStatus Arena::reserve() {
  // MAP_NORESERVE: capacity is address space, not memory; pages are committed on first touch,
  // so a simulated 64 GiB chip costs nothing until it is used.
  int prot = checking_ ? PROT_NONE : (PROT_READ | PROT_WRITE);
  void* p = mmap(nullptr, capacity_, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return fail(ANYCHIP_ERROR_OUT_OF_MEMORY, "%s: cannot reserve %llu bytes of address space: %s",
                label_.c_str(), static_cast<unsigned long long>(capacity_), std::strerror(errno));
  }
  base_ = static_cast<char*>(p);
  insert_free(0, capacity_);
  return ANYCHIP_OK;
}

void Arena::insert_free(uint64_t offset, uint64_t size) {
  free_by_offset_[offset] = size;
  free_by_size_.insert({size, offset});
}

AnychipStatus Arena::allocate(size_t size, void** out) {
  if (out == nullptr) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: ptr is NULL", label_.c_str());
  *out = nullptr;
  if (size == 0) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: cannot allocate 0 bytes", label_.c_str());
  uint64_t need = round_up(size, alignment_);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = need < size ? free_by_size_.end() : free_by_size_.lower_bound({need, 0});
  if (it == free_by_size_.end()) {
    return fail(ANYCHIP_ERROR_OUT_OF_MEMORY,
                "%s out of memory: requested %zu bytes, %llu of %llu free%s", label_.c_str(), size,
                static_cast<unsigned long long>(capacity_ - allocated_),
                static_cast<unsigned long long>(capacity_),
                capacity_ - allocated_ >= need ? " (fragmented)" : "");
  }
  uint64_t block_size = it->first, offset = it->second;
  free_by_size_.erase(it);
  free_by_offset_.erase(offset);
  if (block_size > need) insert_free(offset + need, block_size - need);
  live_[offset] = Block{need, 0};
  allocated_ += need;
  total_allocations_ += 1;
  if (allocated_ > peak_) peak_ = allocated_;
  *out = base_ + offset;
  return ANYCHIP_OK;
}

AnychipStatus Arena::release(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  char* p = static_cast<char*>(ptr);
  auto it = (p >= base_ && p < base_ + capacity_) ? live_.find(p - base_) : live_.end();
  if (it == live_.end()) {
    bool inside = find_live(p >= base_ ? p - base_ : capacity_) != live_.end();
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: free of %p: %s", label_.c_str(), ptr,
                p < base_ || p >= base_ + capacity_ ? "not a pointer of this device"
                : inside ? "points inside an allocation, not at its start"
                         : "not a live allocation (double free?)");
  }
  uint64_t offset = it->first, size = it->second.size;
  if (it->second.open_count != 0) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: free of %p while a copy still uses it",
                label_.c_str(), ptr);
  }
  live_.erase(it);
  allocated_ -= size;
  // Coalesce with the free neighbours so large allocations stay possible.
  auto next = free_by_offset_.find(offset + size);
  if (next != free_by_offset_.end()) {
    size += next->second;
    free_by_size_.erase({next->second, next->first});
    free_by_offset_.erase(next);
  }
  auto prev = free_by_offset_.lower_bound(offset);
  if (prev != free_by_offset_.begin()) {
    --prev;
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      free_by_size_.erase({prev->second, prev->first});
      free_by_offset_.erase(prev);
    }
  }
  insert_free(offset, size);
  return ANYCHIP_OK;
}

std::map<uint64_t, Arena::Block>::iterator Arena::find_live(uint64_t offset) {
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) return live_.end();
  --it;
  return offset < it->first + it->second.size ? it : live_.end();
}

void Arena::protect(uint64_t offset, uint64_t size, bool accessible) {
  mprotect(base_ + offset, size, accessible ? (PROT_READ | PROT_WRITE) : PROT_NONE);
}

AnychipStatus Arena::open(const void* ptr, size_t size, const char* what) {
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  if (p < base_ || p >= base_ + capacity_) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: %s %p is not a pointer of this device",
                label_.c_str(), what, ptr);
  }
  uint64_t offset = p - base_;
  auto it = find_live(offset);
  if (it == live_.end()) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: %s %p is not in a live allocation",
                label_.c_str(), what, ptr);
  }
  if (offset + size > it->first + it->second.size) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                "%s: %s %p + %zu bytes overruns its allocation of %llu bytes by %llu",
                label_.c_str(), what, ptr, size,
                static_cast<unsigned long long>(it->second.size),
                static_cast<unsigned long long>(offset + size - it->first - it->second.size));
  }
  if (checking_ && it->second.open_count++ == 0) protect(it->first, it->second.size, true);
  return ANYCHIP_OK;
}

void Arena::close(const void* ptr) {
  if (!checking_) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = find_live(static_cast<const char*>(ptr) - base_);
  if (it != live_.end() && --it->second.open_count == 0) protect(it->first, it->second.size, false);
}

void Arena::stats(AnychipMemoryStats* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->total_bytes = capacity_;
  out->free_bytes = capacity_ - allocated_;
  out->allocated_bytes = allocated_;
  out->peak_allocated_bytes = peak_;
  out->num_allocations = live_.size();
  out->total_allocations = total_allocations_;
}

}  // namespace anychip::sim
