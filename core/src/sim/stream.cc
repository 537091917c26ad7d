#include "sim/stream.h"

#include <algorithm>

#include "common/last_error.h"

namespace anychip::sim {

uint64_t Event::begin_record() {
  std::lock_guard<std::mutex> lock(mu_);
  return ++recorded_;
}

void Event::complete(uint64_t generation, AnychipStatus status, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (generation >= completed_) {
      status_ = status;
      message_ = message;
    }
    completed_ = std::max(completed_, generation);
    completed_at_ = std::chrono::steady_clock::now();
  }
  cv_.notify_all();
}

bool Event::done(uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= generation;
}

AnychipStatus Event::wait(uint64_t generation, std::string* message) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= generation; });
  if (message != nullptr) *message = message_;
  return status_;
}

AnychipStatus Event::status(std::string* message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (message != nullptr) *message = message_;
  return status_;
}

uint64_t Event::last_recorded() {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_;
}

std::chrono::steady_clock::time_point Event::completed_at() {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_at_;
}

Stream::Stream() : worker_([this] { run(); }) {}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  worker_.join();
}

void Stream::enqueue(Work work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
  }
  work_cv_.notify_one();
}

void Stream::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything enqueued has run
    Work work = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    AnychipStatus before = error_;
    lock.unlock();
    AnychipStatus status = work(before);
    std::string message;
    if (status != ANYCHIP_OK) {
      char buf[512];
      copy_last_error(buf, sizeof(buf));  // the worker's own thread-local message
      message = buf;
    }
    lock.lock();
    busy_ = false;
    if (status != ANYCHIP_OK && error_ == ANYCHIP_OK) {
      error_ = status;
      error_message_ = message;
    }
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

AnychipStatus Stream::query() {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_ || !queue_.empty()) return ANYCHIP_ERROR_NOT_READY;
  return error_;
}

void Stream::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return !busy_ && queue_.empty(); });
}

std::string Stream::error_message() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_message_;
}

AnychipStatus Stream::synchronize(std::string* message) {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return !busy_ && queue_.empty(); });
  AnychipStatus status = error_;
  if (message != nullptr) *message = error_message_;
  error_ = ANYCHIP_OK;
  error_message_.clear();
  return status;
}

}  // namespace anychip::sim
