// libFuzzer target for HTTP request parsing (tools/dev fuzz http_request SECONDS): the parser the
// event-loop engine feeds from each connection (api/http/request_parser.h, Boost.Beast plus the
// RFC 9112 checks). The first input byte picks how the rest is cut into reads; the rest is a
// connection's byte stream, parsed as pipelined requests. Whatever the bytes: no crash, every
// Put consumes at most what it was given, accepted requests respect the limits and carry an
// origin-form target and a valid Host, refusals carry one of the statuses the engine sends, and
// cutting the stream differently never changes which requests are parsed. (Whether and how the
// last, unfinished head is refused may differ: a malformed head can be refused before its end
// arrives or wait for it, and one both malformed and over the limit is 400 or 431 depending on
// how much of it has arrived.)
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "api/http/request_parser.h"

namespace {

using loradb::http::HttpRequest;
using loradb::http::IsValidHostHeader;
using loradb::http::RequestParser;

constexpr size_t kMaxHeader = 1024;
constexpr size_t kMaxBody = 4096;

void Check(bool ok) {
  if (!ok) std::abort();
}

// What the parser made of a stream: each request (method, target, host, body).
struct Outcome {
  std::vector<std::string> requests;
};

Outcome Parse(const std::string& stream, size_t step) {
  Outcome out;
  std::string in;
  size_t fed = 0;
  auto parser = std::make_unique<RequestParser>(kMaxHeader, kMaxBody);
  for (int guard = 0; guard < 1 << 20; ++guard) {
    const size_t used = parser->Put(in);
    Check(used <= in.size());
    in.erase(0, used);
    switch (parser->state()) {
      case RequestParser::State::kFailed: {
        const int s = parser->error().status;
        Check(s == 400 || s == 411 || s == 413 || s == 431);
        Check(!parser->error().message.empty());
        return out;
      }
      case RequestParser::State::kDone: {
        HttpRequest r = parser->TakeRequest();
        Check(!r.target.empty() && r.target[0] == '/');
        Check(r.body.size() <= kMaxBody);
        Check(r.host.empty() || IsValidHostHeader(r.host));
        out.requests.push_back(r.method + " " + r.target + " " + r.host + " " + r.body);
        parser = std::make_unique<RequestParser>(kMaxHeader, kMaxBody);
        continue;
      }
      case RequestParser::State::kHead:
      case RequestParser::State::kBody:
        // A waiting head never holds more than the head limit unconsumed.
        Check(parser->state() != RequestParser::State::kHead || in.size() <= kMaxHeader);
        break;
    }
    if (fed == stream.size()) return out;  // the connection has nothing more to say
    const size_t n = std::min(step, stream.size() - fed);
    in.append(stream, fed, n);
    fed += n;
  }
  std::abort();  // no progress
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 64;
  const std::string stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Outcome at_once = Parse(stream, stream.size() + 1);
  const Outcome in_pieces = Parse(stream, step);
  Check(at_once.requests == in_pieces.requests);
  return 0;
}
