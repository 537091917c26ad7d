// The simulator's streams and events: real asynchrony on host threads.
//
// A Stream owns one worker thread that runs its work items in enqueue order, so code that
// forgets to synchronise sees the same races it would see on a chip. An Event counts records
// and completions; waiting on "the record as of now" is what gives stream_wait_event and
// event_synchronize their CUDA semantics. A record completes with the error its stream had
// then (failed work before it), and a stream that waits on it takes that error as its own, so a
// failure on one stream (a collective whose peer never came) reaches whoever synchronizes a
// stream ordered after it, as CUDA's sticky errors do, instead of vanishing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "anychip/device.h"

namespace anychip::sim {

class Event {
 public:
  // Returns the generation a waiter must see completed.
  uint64_t begin_record();
  // `status` (and its message): the recording stream's error when the record ran.
  void complete(uint64_t generation, AnychipStatus status, const std::string& message);
  bool done(uint64_t generation);
  // Waits for `generation`; returns the error of the latest completed record, its message in
  // `message`.
  AnychipStatus wait(uint64_t generation, std::string* message);
  // The error of the latest completed record (ANYCHIP_OK: none), its message in `message`.
  AnychipStatus status(std::string* message);
  uint64_t last_recorded();
  // Completion time of the last completed record.
  std::chrono::steady_clock::time_point completed_at();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t recorded_ = 0, completed_ = 0;
  AnychipStatus status_ = ANYCHIP_OK;
  std::string message_;
  std::chrono::steady_clock::time_point completed_at_{};
};

class Stream {
 public:
  // A work item returns ANYCHIP_OK or an error status (with last_error set on the worker).
  using Work = std::function<AnychipStatus(AnychipStatus stream_status)>;

  Stream();
  ~Stream();  // drains the queue, then joins the worker
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void enqueue(Work work);
  // True on this stream's own worker, i.e. inside its work (a host function): waiting for
  // the stream there would wait for itself.
  bool runs_on_this_thread() const { return std::this_thread::get_id() == worker_.get_id(); }
  // NOT_READY while work is pending, else the first error since the last synchronize/query.
  AnychipStatus query();
  // Waits for all enqueued work without consuming its error.
  void wait_idle();
  // Waits for all enqueued work; returns (and clears) the first error it reported.
  AnychipStatus synchronize(std::string* message);
  // The message of the stream's error; only for its own work (which sees the error's status).
  std::string error_message();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<Work> queue_;
  bool busy_ = false, stopping_ = false;
  AnychipStatus error_ = ANYCHIP_OK;
  std::string error_message_;
  std::thread worker_;
};

}  // namespace anychip::sim
