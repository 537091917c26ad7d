// How the threads of one decoder_step share out its phases and meet between them.
//
// A step has five phases per layer, each needing all of the previous one's output, so its
// threads meet about 150 times per token. libgomp's barrier spins for a long while before it
// sleeps; on a machine where another process holds a core, the thread that still has work then
// waits for the spinning one's time slice at every barrier (half a second per token instead of
// 14 ms on two cores, measured). Here a waiting thread spins briefly, then yields its core.
#pragma once

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace anychip::cpu::decoder {

// Rows [begin, end) of a product.
struct Rows {
  int64_t begin, end;
};

class Team {
 public:
  explicit Team(int64_t phases) : next_(new std::atomic<int64_t>[phases]) {
    for (int64_t p = 0; p < phases; ++p) next_[p].store(0, std::memory_order_relaxed);
  }

  // Called by every thread of the OpenMP team first (it may have fewer threads than asked for).
  void join() { threads_.store(omp_get_num_threads(), std::memory_order_relaxed); }

  // This thread's share of a product's n output rows: one run of whole 16-row tiles, so that
  // its weights stream from memory in one piece.
  static Rows rows(int64_t n) {
    const int64_t tiles = (n + 15) / 16, t = omp_get_thread_num(), threads = omp_get_num_threads();
    return {std::min(n, 16 * (tiles * t / threads)), std::min(n, 16 * (tiles * (t + 1) / threads))};
  }

  // Runs body(i) for the items i < n of `phase` that this thread claims, first come, first served.
  template <typename Body>
  void claim(int64_t phase, int64_t n, Body&& body) {
    for (int64_t i; (i = next_[phase].fetch_add(1, std::memory_order_relaxed)) < n;) body(i);
  }

  // Returns when every thread of the team has called it.
  void barrier() {
    const int64_t generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == threads_.load(std::memory_order_relaxed) - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(generation + 1, std::memory_order_release);
      return;
    }
    for (int spin = 0; generation_.load(std::memory_order_acquire) == generation; ++spin) {
      if (spin < kSpins) {
        __builtin_ia32_pause();
      } else {
        sched_yield();
      }
    }
  }

 private:
  static constexpr int kSpins = 256;

  std::atomic<int> threads_{1};
  std::unique_ptr<std::atomic<int64_t>[]> next_;  // per phase: the next item to claim
  std::atomic<int> arrived_{0};
  std::atomic<int64_t> generation_{0};
};

}  // namespace anychip::cpu::decoder
