// ReplyStream: a reply produced over time by another thread (a decoder's driver thread, say),
// written by the event loop as it arrives, with the client's disconnect reported back so the
// producer can stop.
//
// A handler returns a Reply whose `stream` is set; the engine then keeps the connection busy
// (never evicted, no request read after it) until the stream ends. Two kinds:
// - Streamed (ReplyStream::Streamed()): the reply's status and headers go out at once, the body
//   in HTTP/1.1 chunked transfer coding, one chunk per Send, ending with End.
// - Deferred (ReplyStream::Deferred()): nothing goes out until Answer hands over the whole
//   reply, which is then written as any other (with Content-Length). The handler's thread is
//   free meanwhile and the disconnect is still reported.
// If the client goes away first (its connection closed, reset, timed out writing, or closed by
// the drain deadline), the function given to OnCancel runs once, on the loop's thread; later
// Send/End/Answer calls are dropped.
//
// Thread-safe: the producer calls Send/End/Answer/OnCancel from any thread; the engine calls
// Attach/Take/Cancel.
#ifndef LORADB_API_HTTP_REPLY_STREAM_H_
#define LORADB_API_HTTP_REPLY_STREAM_H_

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/http/router.h"

namespace loradb::http {

class ReplyStream {
 public:
  static std::shared_ptr<ReplyStream> Streamed();
  static std::shared_ptr<ReplyStream> Deferred();

  bool deferred() const { return deferred_; }

  // Producer side.
  // Appends body bytes (streamed kind; empty data is ignored). False once the client is gone.
  bool Send(std::string data);
  // Ends the streamed body (idempotent).
  void End();
  // The whole reply (deferred kind; its own `stream` must be null). Only the first call counts.
  void Answer(Reply reply);
  // `fn` runs once if the client goes away before the stream ends (at once, on this thread, if
  // it already has). Replaces an earlier function.
  void OnCancel(std::function<void()> fn);
  // True once the client is gone.
  bool cancelled() const;

  // Engine side.
  // `wake` is called (without the stream's lock) whenever Send/End/Answer adds something;
  // called once at once if something is already waiting.
  void Attach(std::function<void()> wake);
  // What arrived since the last Take.
  struct Taken {
    std::string data;             // streamed body bytes
    bool ended = false;           // streamed: End was called
    std::optional<Reply> answer;  // deferred: the reply
  };
  Taken Take();
  // The client is gone: runs the cancel function (unless the stream already ended), detaches
  // the wake function, drops what is buffered and everything sent later.
  void Cancel();

 private:
  explicit ReplyStream(bool deferred) : deferred_(deferred) {}
  void Notify(std::unique_lock<std::mutex>& lock);

  const bool deferred_;
  mutable std::mutex mu_;
  std::string buffered_;
  bool ended_ = false;
  bool taken_end_ = false;
  std::optional<Reply> answer_;
  bool cancelled_ = false;
  std::function<void()> wake_;
  std::function<void()> on_cancel_;
};

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_REPLY_STREAM_H_
