#include "api/http/reply_stream.h"

#include <utility>

namespace loradb::http {

std::shared_ptr<ReplyStream> ReplyStream::Streamed() {
  return std::shared_ptr<ReplyStream>(new ReplyStream(false));
}

std::shared_ptr<ReplyStream> ReplyStream::Deferred() {
  return std::shared_ptr<ReplyStream>(new ReplyStream(true));
}

void ReplyStream::Notify(std::unique_lock<std::mutex>& lock) {
  std::function<void()> wake = wake_;
  lock.unlock();
  if (wake) wake();
}

bool ReplyStream::Send(std::string data) {
  std::unique_lock<std::mutex> lock(mu_);
  if (cancelled_) return false;
  if (deferred_ || ended_ || data.empty()) return true;
  buffered_.append(data);
  Notify(lock);
  return true;
}

void ReplyStream::End() {
  std::unique_lock<std::mutex> lock(mu_);
  if (cancelled_ || deferred_ || ended_) return;
  ended_ = true;
  Notify(lock);
}

void ReplyStream::Answer(Reply reply) {
  std::unique_lock<std::mutex> lock(mu_);
  if (cancelled_ || !deferred_ || ended_) return;
  reply.stream.reset();
  answer_ = std::move(reply);
  ended_ = true;
  Notify(lock);
}

void ReplyStream::OnCancel(std::function<void()> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (cancelled_) {
    lock.unlock();
    if (fn) fn();
    return;
  }
  on_cancel_ = std::move(fn);
}

bool ReplyStream::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void ReplyStream::Attach(std::function<void()> wake) {
  std::unique_lock<std::mutex> lock(mu_);
  wake_ = std::move(wake);
  if (!buffered_.empty() || (ended_ && !taken_end_)) Notify(lock);
}

ReplyStream::Taken ReplyStream::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  Taken t;
  t.data.swap(buffered_);
  if (ended_ && !taken_end_) {
    taken_end_ = true;
    t.ended = true;
    t.answer = std::move(answer_);
    answer_.reset();
  }
  return t;
}

void ReplyStream::Cancel() {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    cancelled_ = true;
    wake_ = nullptr;
    buffered_.clear();
    answer_.reset();
    // A stream the client received in full is not cancelled work.
    if (!taken_end_) fn = std::move(on_cancel_);
    on_cancel_ = nullptr;
  }
  if (fn) fn();
}

}  // namespace loradb::http
