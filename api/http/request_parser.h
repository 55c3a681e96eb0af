// Incremental parsing of HTTP/1.1 requests for the event-loop engine. The syntax is Boost.Beast's
// request parser (header-only, fed from the connection's buffer with put(), no Asio I/O); this
// layer adds what RFC 9112 asks of a server and Beast leaves to its user, so that every request
// the engine hands on has one unambiguous reading:
// - bare LF or CR, NUL and other control characters in the head: 400 (Beast);
// - obsolete line folding (a header line starting with SP/HTAB): 400;
// - Content-Length repeated, not a plain decimal, or together with Transfer-Encoding: 400;
//   Transfer-Encoding alone: 411 (bodies are bounded by Content-Length only, so a chunked body
//   is refused before it is read);
// - more than one Host, no Host on HTTP/1.1, or a Host that is not `uri-host [":" port]`
//   (empty, junk after an IPv6 literal such as `[::1]evil.com`): 400;
// - a request target that is not an absolute path (origin-form): 400;
// - head over max_header_bytes: 431; Content-Length over max_body_bytes: 413, decided before
//   any of the body is read.
// Every error ends the connection (the caller answers and closes): after a framing error the
// next request's first byte is unknown.
#ifndef LORADB_API_HTTP_REQUEST_PARSER_H_
#define LORADB_API_HTTP_REQUEST_PARSER_H_

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace loradb::http {

// One parsed request handed to the handler.
struct HttpRequest {
  std::string method;  // as sent ("HEAD" is answered by the GET route without a body)
  std::string target;  // raw path + query, still percent-encoded
  std::string host;    // the one Host value (validated), empty on HTTP/1.0 without one
  std::string authorization;
  std::string api_key;  // X-API-Key (the Tinker SDK's credential)
  std::string content_type;
  std::string content_encoding;
  std::string accept;
  std::multimap<std::string, std::string> query;  // decoded key/value pairs
  std::string body;
};

// Why a request was refused: the HTTP status, the error code string and a message.
struct ParseError {
  int status = 400;
  std::string code = "bad_request";
  std::string message;
};

// Percent-decodes a query component ('+' is a space); malformed escapes stay as they are.
std::string DecodeQueryComponent(const std::string& s);
// Splits "a=1&b=2" into decoded pairs (a key without '=' has an empty value).
std::multimap<std::string, std::string> ParseQueryString(const std::string& query);
// True when `value` is a Host field value RFC 9112 accepts (`uri-host [":" port]`, host not
// empty): an IP-literal in brackets followed by nothing or a port, or reg-name / IPv4 characters.
bool IsValidHostHeader(absl::string_view value);

// Parses one request. Feed it bytes with Put until state() is kDone or kFailed; then take the
// request (kDone) or the error (kFailed) and start a new parser for the next request on the
// connection. Not thread-safe; cheap to construct.
class RequestParser {
 public:
  enum class State {
    kHead,    // waiting for (the rest of) the request head
    kBody,    // the head passed every check; waiting for (the rest of) the body
    kDone,    // a whole request
    kFailed,  // refused: see error()
  };

  RequestParser(size_t max_header_bytes, size_t max_body_bytes);
  ~RequestParser();
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;

  // Parses from the front of `in` and returns how many bytes it consumed; the caller drops
  // those and calls again with them gone and more appended. Part of a head may stay
  // unconsumed until the rest arrives; consumed + unconsumed head over max_header_bytes fails
  // (431). Call only in kHead/kBody.
  size_t Put(absl::string_view in);

  State state() const { return state_; }
  // Valid from kBody on: the client asked for "100 Continue" before sending its body.
  bool expect_continue() const { return expect_continue_; }
  // Valid from kBody on: HTTP/1.1 without "Connection: close", or HTTP/1.0 with keep-alive.
  bool keep_alive() const { return keep_alive_; }
  // Valid from kBody on: the declared body length.
  size_t content_length() const { return content_length_; }
  const ParseError& error() const { return error_; }
  // kDone: the request (moved out once).
  HttpRequest TakeRequest();

 private:
  struct Beast;
  void Fail(int status, std::string code, std::string message);
  // The checks after a whole head; moves to kBody/kDone or fails. `head` is the head's bytes.
  void CheckHead(absl::string_view head);
  void Finish();

  std::unique_ptr<Beast> beast_;
  State state_ = State::kHead;
  bool expect_continue_ = false;
  bool keep_alive_ = false;
  size_t content_length_ = 0;
  const size_t max_header_bytes_;
  const size_t max_body_bytes_;
  ParseError error_;
  HttpRequest request_;
};

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_REQUEST_PARSER_H_
