// The request parser on its own: the same bytes give the same request whether they arrive at
// once or one byte at a time, pipelined requests split where they should, and the Host values
// RFC 9112 refuses are refused.
#include "api/http/request_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loradb::http {
namespace {

// Feeds `stream` in pieces of `step` bytes; returns the requests parsed (stops at an error,
// whose status goes to *failed_status).
std::vector<HttpRequest> ParseAll(const std::string& stream, size_t step, int* failed_status) {
  std::vector<HttpRequest> out;
  std::string in;
  size_t fed = 0;
  auto parser = std::make_unique<RequestParser>(1024, 1024);
  *failed_status = 0;
  while (true) {
    in.erase(0, parser->Put(in));
    if (parser->state() == RequestParser::State::kFailed) {
      *failed_status = parser->error().status;
      return out;
    }
    if (parser->state() == RequestParser::State::kDone) {
      out.push_back(parser->TakeRequest());
      parser = std::make_unique<RequestParser>(1024, 1024);
      continue;
    }
    if (fed == stream.size()) return out;
    const size_t n = std::min(step, stream.size() - fed);
    in.append(stream, fed, n);
    fed += n;
  }
}

TEST(RequestParserTest, ByteByByteEqualsAllAtOnce) {
  const std::string stream =
      "GET /v1/x?a=1&b=%2F HTTP/1.1\r\nHost: localhost:8080\r\n\r\n"
      "POST /v1/y HTTP/1.1\r\nhost: [::1]:80\r\nAUTHORIZATION: bearer t\r\n"
      "Content-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}"
      "GET / HTTP/1.0\r\n\r\n";
  for (size_t step : {stream.size(), size_t{1}, size_t{7}}) {
    int failed = 0;
    std::vector<HttpRequest> r = ParseAll(stream, step, &failed);
    EXPECT_EQ(failed, 0) << step;
    ASSERT_EQ(r.size(), 3u) << step;
    EXPECT_EQ(r[0].method, "GET");
    EXPECT_EQ(r[0].host, "localhost:8080");
    EXPECT_EQ(r[0].query.find("b")->second, "/");
    EXPECT_EQ(r[1].method, "POST");
    EXPECT_EQ(r[1].authorization, "bearer t");
    EXPECT_EQ(r[1].content_type, "application/json");
    EXPECT_EQ(r[1].body, "{\"a\":1}");
    EXPECT_EQ(r[2].target, "/");
    EXPECT_EQ(r[2].host, "");  // HTTP/1.0 may leave Host out
  }
}

TEST(RequestParserTest, ErrorsStopTheStream) {
  struct Case {
    std::string stream;
    int status;
  };
  const std::vector<Case> cases = {
      {"GET / HTTP/1.1\r\nHost: a\r\nX: 1\nContent-Length: 3\r\n\r\nabc", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: " + std::string(2000, 'x') + "\r\n\r\n", 431},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n", 413},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411},
  };
  for (const Case& c : cases) {
    for (size_t step : {c.stream.size(), size_t{1}}) {
      int failed = 0;
      std::vector<HttpRequest> r = ParseAll(c.stream, step, &failed);
      EXPECT_TRUE(r.empty()) << c.stream;
      EXPECT_EQ(failed, c.status) << c.stream << " step " << step;
    }
  }
}

TEST(RequestParserTest, HostValues) {
  for (const char* ok : {"127.0.0.1", "localhost", "localhost:8080", "[::1]", "[::1]:80",
                         "a.example", "x:", "[v1.fe]"}) {
    EXPECT_TRUE(IsValidHostHeader(ok)) << ok;
  }
  for (const char* bad : {"", ":80", "[::1]evil.com", "[::1", "[]", "a b", "a:80:80", "a:123456",
                          "a:8x", "a/b", "a@b", "[::1]:80x"}) {
    EXPECT_FALSE(IsValidHostHeader(bad)) << bad;
  }
  EXPECT_FALSE(IsValidHostHeader(std::string("127.0.0.1\0.evil.com", 19)));
}

}  // namespace
}  // namespace loradb::http
