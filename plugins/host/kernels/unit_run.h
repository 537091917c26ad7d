// Runs of units (row blocks of a product) that threads own and walk front to back, and that a
// thread done with its own run helps finish from the back.
//
// One contiguous run per thread keeps each core's weight stream in order, its prefetches
// running on into its next unit (handing units out as threads came free was 5-20% slower:
// every unit began a new stream). Stopping at the end of its own run, though, a thread waited
// for the other: on two cores, their 4-bit GEMVs (K=N=4096, ~300 us) ended 25-30 us apart
// (median), as one core's memory stream or time slice ran behind. decoder_step keeps one
// fixed run per thread: its products take a few microseconds a thread (SmolLM2), and helping
// there (units of 32 or 128 rows) decoded no faster (tok/s, alternating builds, 2026-12-01).
#pragma once

#include <atomic>
#include <cstdint>

namespace anychip::cpu {

// A thread's run of units, [next, end), in one word, so that its owner (taking `next`) and a
// helper (taking `end - 1`) never take the same unit; a cache line each, as the owners of
// neighbouring runs take from theirs at the same time.
class alignas(64) UnitRun {
 public:
  void reset(int64_t begin, int64_t end) {
    span_.store(pack(static_cast<uint32_t>(begin), static_cast<uint32_t>(end)), std::memory_order_relaxed);
  }

  // The next unit from the front (the owner) or from the back (a helper); -1 once none is left.
  int64_t take(bool front) {
    uint64_t span = span_.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t next = static_cast<uint32_t>(span >> 32), end = static_cast<uint32_t>(span);
      if (next >= end) return -1;
      const uint64_t taken = front ? pack(next + 1, end) : pack(next, end - 1);
      if (span_.compare_exchange_weak(span, taken, std::memory_order_relaxed)) return front ? next : end - 1;
    }
  }

 private:
  static uint64_t pack(uint32_t next, uint32_t end) { return uint64_t{next} << 32 | end; }
  std::atomic<uint64_t> span_{0};
};

// `units` units split into `count` runs (runs[0 .. count)), one per thread asked for: a run
// whose thread OpenMP did not start is finished by the others from the back.
inline void split_runs(UnitRun* runs, int count, int64_t units) {
  for (int t = 0; t < count; ++t) runs[t].reset(units * t / count, units * (t + 1) / count);
}

// Calls body(unit) for the units thread `t` of `count` takes: its own run from the front, then
// what is left of the others' from the back.
template <typename Body>
void walk_runs(UnitRun* runs, int count, int t, Body&& body) {
  for (int64_t u; (u = runs[t].take(true)) >= 0;) body(u);
  for (int i = 1; i < count; ++i)
    for (int64_t u; (u = runs[(t + i) % count].take(false)) >= 0;) body(u);
}

}  // namespace anychip::cpu
