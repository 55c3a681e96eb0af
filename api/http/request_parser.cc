#include "api/http/request_parser.h"

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loradb::http {
namespace {

namespace bhttp = boost::beast::http;

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string ToString(boost::beast::string_view s) { return std::string(s.data(), s.size()); }

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// RFC 3986 reg-name / IPv4address characters: unreserved, pct-encoded, sub-delims.
bool IsRegNameChar(char c) {
  // (strchr would also find the terminating NUL.)
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         (c != '\0' && std::strchr("-._~!$&'()*+,;=%", c) != nullptr);
}

}  // namespace

std::string DecodeQueryComponent(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::multimap<std::string, std::string> ParseQueryString(const std::string& query) {
  std::multimap<std::string, std::string> out;
  size_t start = 0;
  while (start <= query.size()) {
    size_t amp = query.find('&', start);
    if (amp == std::string::npos) amp = query.size();
    std::string part = query.substr(start, amp - start);
    if (!part.empty()) {
      size_t eq = part.find('=');
      if (eq == std::string::npos) {
        out.emplace(DecodeQueryComponent(part), "");
      } else {
        out.emplace(DecodeQueryComponent(part.substr(0, eq)),
                    DecodeQueryComponent(part.substr(eq + 1)));
      }
    }
    start = amp + 1;
  }
  return out;
}

bool IsValidHostHeader(absl::string_view value) {
  absl::string_view rest;
  if (!value.empty() && value[0] == '[') {
    size_t close = value.find(']');
    if (close == absl::string_view::npos || close == 1) return false;
    for (char c : value.substr(1, close - 1)) {
      // IPv6 (hex, ':', '.' for an embedded IPv4) or an IPvFuture ("v1.x").
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.' &&
          c != 'v' && c != 'V') {
        return false;
      }
    }
    rest = value.substr(close + 1);
  } else {
    size_t colon = value.find(':');
    absl::string_view host = value.substr(0, colon);
    if (host.empty()) return false;
    for (char c : host) {
      if (!IsRegNameChar(c)) return false;
    }
    rest = colon == absl::string_view::npos ? absl::string_view() : value.substr(colon);
  }
  if (rest.empty()) return true;
  // ":" port, port = *DIGIT (at most 5 of them).
  if (rest[0] != ':' || rest.size() > 6) return false;
  return rest.size() == 1 || AllDigits(rest.substr(1));
}

struct RequestParser::Beast {
  bhttp::request_parser<bhttp::string_body> parser;
  std::string head;  // the head's raw bytes, for the checks Beast does not make
};

RequestParser::RequestParser(size_t max_header_bytes, size_t max_body_bytes)
    : beast_(std::make_unique<Beast>()),
      max_header_bytes_(max_header_bytes),
      max_body_bytes_(max_body_bytes) {
  beast_->parser.header_limit(static_cast<std::uint32_t>(max_header_bytes));
  beast_->parser.body_limit(max_body_bytes);
  beast_->parser.eager(false);  // stop after the head so it is checked before the body
}

RequestParser::~RequestParser() = default;

void RequestParser::Fail(int status, std::string code, std::string message) {
  state_ = State::kFailed;
  error_ = ParseError{status, std::move(code), std::move(message)};
}

size_t RequestParser::Put(absl::string_view in) {
  size_t used = 0;
  while ((state_ == State::kHead || state_ == State::kBody) && used < in.size()) {
    boost::beast::error_code ec;
    size_t n = 0;
    try {
      n = beast_->parser.put(boost::asio::const_buffer(in.data() + used, in.size() - used), ec);
    } catch (const std::exception& e) {
      Fail(400, "bad_request", absl::StrCat("malformed request: ", e.what()));
      return used;
    }
    if (state_ == State::kHead) beast_->head.append(in.data() + used, n);
    used += n;
    if (ec == bhttp::error::need_more) break;
    if (ec) {
      if (ec == bhttp::error::header_limit) {
        Fail(431, "headers_too_large",
             absl::StrCat("request head exceeds ", max_header_bytes_, " bytes"));
      } else if (ec == bhttp::error::body_limit) {
        Fail(413, "payload_too_large",
             absl::StrCat("request body exceeds the limit of ", max_body_bytes_, " bytes"));
      } else if (ec == bhttp::error::bad_content_length ||
                 ec == bhttp::error::bad_transfer_encoding) {
        Fail(400, "bad_request",
             absl::StrCat("malformed, repeated or conflicting Content-Length / "
                          "Transfer-Encoding (",
                          ec.message(), ")"));
      } else if (ec == bhttp::error::bad_method) {
        Fail(400, "bad_request", "malformed request line (method)");
      } else if (ec == bhttp::error::bad_target) {
        Fail(400, "bad_request", "malformed request line (target)");
      } else if (ec == bhttp::error::bad_version) {
        Fail(400, "bad_request",
             "malformed request line (HTTP versions 1.0 and 1.1 are served; lines end in CRLF)");
      } else {
        Fail(400, "bad_request",
             absl::StrCat("malformed request head (", ec.message(),
                          "; header lines end in CRLF, values carry no control characters)"));
      }
      break;
    }
    if (state_ == State::kHead && beast_->parser.is_header_done()) {
      if (beast_->head.size() > max_header_bytes_) {
        Fail(431, "headers_too_large",
             absl::StrCat("request head exceeds ", max_header_bytes_, " bytes"));
        break;
      }
      CheckHead(beast_->head);
      if (state_ == State::kBody) beast_->parser.eager(true);
    }
    if (state_ == State::kBody && beast_->parser.is_done()) Finish();
    if (n == 0) break;
  }
  // Beast bounds each put's unconsumed head; the whole head (consumed + waiting) is bounded here.
  if (state_ == State::kHead && beast_->head.size() + (in.size() - used) > max_header_bytes_) {
    Fail(431, "headers_too_large", absl::StrCat("request head exceeds ", max_header_bytes_, " bytes"));
  }
  return used;
}

void RequestParser::CheckHead(absl::string_view head) {
  auto& m = beast_->parser.get();
  request_.method = ToString(m.method_string());
  request_.target = ToString(m.target());
  if (request_.target.empty() || request_.target[0] != '/') {
    return Fail(400, "bad_request", "request target must be an absolute path");
  }
  if (absl::StrContains(head, "\r\n ") || absl::StrContains(head, "\r\n\t")) {
    return Fail(400, "bad_request", "obsolete line folding in the request head");
  }
  const size_t hosts = m.count(bhttp::field::host);
  if (hosts > 1) return Fail(400, "bad_request", "more than one Host header");
  if (hosts == 0 && m.version() >= 11) {
    return Fail(400, "bad_request", "an HTTP/1.1 request needs a Host header");
  }
  if (hosts == 1) {
    request_.host = ToString(m.find(bhttp::field::host)->value());
    if (!IsValidHostHeader(request_.host)) {
      return Fail(400, "bad_request", "malformed Host header (want host[:port])");
    }
  }
  const size_t lengths = m.count(bhttp::field::content_length);
  if (lengths > 1 ||
      (lengths == 1 && !AllDigits(ToString(m.find(bhttp::field::content_length)->value())))) {
    return Fail(400, "bad_request", "malformed or repeated Content-Length");
  }
  if (m.count(bhttp::field::transfer_encoding) > 0) {
    if (lengths > 0) {
      return Fail(400, "bad_request", "Content-Length together with Transfer-Encoding");
    }
    // Bodies are bounded by Content-Length alone: a chunked one is refused before it is read.
    return Fail(411, "length_required",
                "chunked request bodies are not accepted; send Content-Length");
  }
  auto first = [&m](bhttp::field f) {
    auto it = m.find(f);
    return it == m.end() ? std::string() : ToString(it->value());
  };
  request_.authorization = first(bhttp::field::authorization);
  request_.content_type = first(bhttp::field::content_type);
  request_.content_encoding = first(bhttp::field::content_encoding);
  request_.accept = first(bhttp::field::accept);
  if (auto key = m.find("X-API-Key"); key != m.end()) request_.api_key = ToString(key->value());
  expect_continue_ = absl::EqualsIgnoreCase(first(bhttp::field::expect), "100-continue");
  keep_alive_ = beast_->parser.keep_alive();
  content_length_ = static_cast<size_t>(beast_->parser.content_length().value_or(0));
  state_ = State::kBody;
}

void RequestParser::Finish() {
  request_.body = std::move(beast_->parser.get().body());
  size_t q = request_.target.find('?');
  if (q != std::string::npos) request_.query = ParseQueryString(request_.target.substr(q + 1));
  state_ = State::kDone;
}

HttpRequest RequestParser::TakeRequest() { return std::move(request_); }

}  // namespace loradb::http
