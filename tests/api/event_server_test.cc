// The event-loop engine of the HTTP endpoint, driven over raw loopback sockets: keep-alive and
// pipelining, HEAD, query decoding, every limit (head 431, body 413 with a lingering close,
// chunked 411, malformed and ambiguous heads 400 as RFC 9112 asks), the connection budget
// (evicting idle and trickling connections, 503 when all are busy, the per-client cap), the
// head and body deadlines, the read timeout for silent clients, and the drain finishing a
// request that was half received when shutdown began; replies produced over time by another
// thread (streamed in chunks or deferred), cancelled when the client goes away.
#include "api/http/event_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "api/http/reply_stream.h"
#include "api/http/server.h"

namespace loradb::http {
namespace {

class EventServerTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = {}) {
    options.host = "127.0.0.1";
    options.port = 0;
    options.token = "test-token-0123456789";
    if (options.event_threads == 0) options.event_threads = 2;
    auto server = Server::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_TRUE(server_->router()
                    ->Add(MakeRoute("GET", "/echo",
                                    [](const Call& c) -> absl::StatusOr<Reply> {
                                      nlohmann::json q = nlohmann::json::object();
                                      for (const auto& [k, v] : c.query) q[k] = v;
                                      return Reply::Json({{"query", q}});
                                    },
                                    {}))
                    .ok());
    ASSERT_TRUE(server_->router()
                    ->Add(MakeRoute("POST", "/echo",
                                    [](const Call& c) -> absl::StatusOr<Reply> {
                                      return Reply::Json({{"body", c.body}}, 201);
                                    },
                                    {}))
                    .ok());
    ASSERT_TRUE(server_->router()
                    ->Add(MakeRoute("POST", "/block",
                                    [this](const Call&) -> absl::StatusOr<Reply> {
                                      unblocked_future_.wait();
                                      return Reply::Json({{"unblocked", true}});
                                    },
                                    {}))
                    .ok());
    // A read marked blocking (like a blob read): waits until the test releases it.
    Route slow = MakeRoute("GET", "/slow/{n}",
                           [this](const Call& c) -> absl::StatusOr<Reply> {
                             if (!slow_started_once_.exchange(true)) slow_started_.set_value();
                             const bool released =
                                 slow_release_.wait_for(std::chrono::seconds(60)) ==
                                 std::future_status::ready;
                             return Reply::Json({{"n", c.Param("n")}, {"released", released}});
                           },
                           {});
    slow.blocking = true;
    ASSERT_TRUE(server_->router()->Add(std::move(slow)).ok());
    // Replies produced by the test thread: /stream/streamed and /stream/deferred hand their
    // ReplyStream to the test (streams_) and return at once.
    ASSERT_TRUE(server_->router()
                    ->Add(MakeRoute("POST", "/stream/{kind}",
                                    [this](const Call& c) -> absl::StatusOr<Reply> {
                                      Reply r;
                                      r.content_type = "text/event-stream";
                                      r.stream = c.Param("kind") == "deferred"
                                                     ? ReplyStream::Deferred()
                                                     : ReplyStream::Streamed();
                                      auto cancelled = std::make_shared<std::promise<void>>();
                                      r.stream->OnCancel([cancelled] { cancelled->set_value(); });
                                      {
                                        std::lock_guard<std::mutex> lock(streams_mu_);
                                        streams_.push_back({r.stream, cancelled->get_future()});
                                      }
                                      return r;
                                    },
                                    {}))
                    .ok());
    ASSERT_TRUE(server_->Bind().ok());
    thread_ = std::thread([this] { serve_status_ = server_->Serve(); });
  }

  void TearDown() override {
    if (!unblocked_) unblock_.set_value();  // a failed test must not leave a handler waiting
    ReleaseSlow();
    if (server_ != nullptr) {
      server_->Shutdown();
      thread_.join();
      EXPECT_TRUE(serve_status_.ok()) << serve_status_;
    }
  }

  // A connection to the server from `source` (any 127.x address: each is a distinct client).
  int Connect(const char* source = nullptr) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (source != nullptr) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &local.sin_addr);
      EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0);
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{30, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }

  static void Send(int fd, const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }

  // Reads until `count` complete responses (by Content-Length) arrived or the peer closed.
  static std::string ReadResponses(int fd, int count) {
    std::string buf;
    char chunk[8192];
    for (;;) {
      int complete = 0;
      size_t pos = 0;
      for (;;) {
        size_t end = buf.find("\r\n\r\n", pos);
        if (end == std::string::npos) break;
        size_t cl = buf.find("Content-Length: ", pos);
        size_t len = 0;
        if (cl != std::string::npos && cl < end) len = std::stoul(buf.substr(cl + 16));
        if (buf.size() < end + 4 + len) break;
        ++complete;
        pos = end + 4 + len;
      }
      if (complete >= count) return buf;
      ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) return buf;
      buf.append(chunk, static_cast<size_t>(n));
    }
  }

  // True when the server closed `fd` without sending anything (false on data or a 30 s timeout).
  static bool ClosedByServer(int fd) {
    char b;
    ssize_t n = ::recv(fd, &b, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

  // Everything until the peer closes (or the 30 s receive timeout).
  static std::string ReadToClose(int fd) {
    std::string buf;
    char chunk[8192];
    for (;;) {
      ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) return buf;
      buf.append(chunk, static_cast<size_t>(n));
    }
  }

  // A new connection gets 200 for /healthz.
  void ExpectHealthz() {
    int fd = Connect();
    Send(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    EXPECT_TRUE(absl::StartsWith(ReadResponses(fd, 1), "HTTP/1.1 200"));
    ::close(fd);
  }

  // A request on a new connection; everything until the server closes it.
  std::string FreshRequest(const std::string& request) {
    int fd = Connect();
    Send(fd, request);
    std::string r = ReadToClose(fd);
    ::close(fd);
    return r;
  }

  // Sends `data` one byte every 20 ms until the server answers or closes (bounded by the
  // data); returns what the server sent until it closed.
  static std::string Trickle(int fd, const std::string& data) {
    for (char ch : data) {
      char probe;
      ssize_t n = ::recv(fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n >= 0) break;  // an answer, or EOF
      if (::send(fd, &ch, 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ReadToClose(fd);
  }

  // Waits (ordering only) until the server has accepted `n` connections into its budget.
  void WaitForOpenConnections(int64_t n) {
    for (int i = 0; i < 2000 && server_->metrics().connections_open.load() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(server_->metrics().connections_open.load(), n);
  }

  void ReleaseSlow() {
    if (!slow_released_) slow_release_promise_.set_value();
    slow_released_ = true;
  }

  std::promise<void> unblock_;
  std::shared_future<void> unblocked_future_ = unblock_.get_future().share();
  bool unblocked_ = false;
  std::promise<void> slow_started_;  // set by the first /slow call
  std::atomic<bool> slow_started_once_{false};
  std::promise<void> slow_release_promise_;
  std::shared_future<void> slow_release_ = slow_release_promise_.get_future().share();
  bool slow_released_ = false;
  // The n-th stream a /stream call created (waits for it, ordering only).
  std::shared_ptr<ReplyStream> StreamNumber(size_t n) {
    for (int i = 0; i < 6000; ++i) {
      {
        std::lock_guard<std::mutex> lock(streams_mu_);
        if (streams_.size() > n) return streams_[n].stream;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return nullptr;
  }
  // True when stream n's cancel function ran (waits up to 30 s).
  bool StreamCancelled(size_t n) {
    std::lock_guard<std::mutex> lock(streams_mu_);
    return streams_[n].cancelled.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  }

  struct MadeStream {
    std::shared_ptr<ReplyStream> stream;
    std::future<void> cancelled;
  };
  std::mutex streams_mu_;
  std::vector<MadeStream> streams_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  absl::Status serve_status_;
};

constexpr char kStreamRequest[] =
    "POST /stream/streamed HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    "Authorization: Bearer test-token-0123456789\r\nContent-Length: 0\r\n\r\n";

// A string literal with its embedded NULs.
template <size_t N>
std::string Raw(const char (&s)[N]) {
  return std::string(s, N - 1);
}

int Count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

TEST_F(EventServerTest, KeepAlivePipeliningHeadAndQuery) {
  Start();
  int fd = Connect();
  Send(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  std::string r = ReadResponses(fd, 1);
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200 OK\r\n")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Connection: keep-alive")) << r;
  // Three pipelined requests in one write, answered in order on the same connection.
  Send(fd,
       "GET /echo?a=1&b=x%2Fy+z&c HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
       "HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
       "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer test-token-0123456789\r\n"
       "Content-Type: application/json\r\nContent-Length: 5\r\n\r\nhello");
  r = ReadResponses(fd, 3);
  EXPECT_EQ(Count(r, "HTTP/1.1 "), 3) << r;
  EXPECT_TRUE(absl::StrContains(r, R"({"query":{"a":"1","b":"x/y z","c":""}})")) << r;
  EXPECT_TRUE(absl::StrContains(r, "HTTP/1.1 201 Created")) << r;
  EXPECT_TRUE(absl::StrContains(r, R"({"body":"hello"})")) << r;
  // The HEAD response has a Content-Length but no body: the next response follows its head.
  EXPECT_TRUE(absl::StrContains(r, "keep-alive\r\n\r\nHTTP/1.1 201")) << r;
  // HTTP/1.0 without keep-alive: answered, then closed.
  Send(fd, "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  r = ReadToClose(fd);
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Connection: close")) << r;
  ::close(fd);
}

TEST_F(EventServerTest, LimitsAnswerWithJsonErrors) {
  ServerOptions o;
  o.max_body_bytes = 1000;
  o.max_header_bytes = 2048;
  Start(o);
  struct Case {
    std::string request;
    std::string status;
    std::string code;
  };
  const std::string auth = "Authorization: Bearer test-token-0123456789\r\n";
  std::vector<Case> cases = {
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + std::string(4000, 'a') + "\r\n\r\n", "431",
       "headers_too_large"},
      {"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + "Content-Length: 5000\r\n\r\n" + std::string(5000, 'b'),
       "413", "payload_too_large"},
      {"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
           "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
       "411", "length_required"},
      {"GARBAGE\r\n\r\n", "400", "bad_request"},
      {"GET no-slash HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "400", "bad_request"},
      {"GET / HTTP/2.0\r\n\r\n", "400", "bad_request"},
      {"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
       "400", "bad_request"},
      {"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab",
       "400", "bad_request"},
      {"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\n", "400",
       "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n folded: header\r\n\r\n", "400",
       "bad_request"},
      // RFC 9112: bare LF inside the head (hiding a Content-Length), CR / NUL / LF in a value,
      // obs-fold, Content-Length with Transfer-Encoding, and every Host the section on Host
      // refuses.
      {"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
           "X-A: x\nContent-Length: 37\r\n\r\nGET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
       "400", "bad_request"},
      {"GET /healthz HTTP/1.1\nHost: 127.0.0.1\r\n\r\n", "400", "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\rb\r\n\r\n", "400", "bad_request"},
      {Raw("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\0b\r\n\r\n"),
       "400", "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\r\n b\r\n\r\n", "400", "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\r\n\tb\r\n\r\n", "400",
       "bad_request"},
      {"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
           "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       "400", "bad_request"},
      {"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
           "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
       "400", "bad_request"},
      {"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
           "Transfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello",
       "400", "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost: evil.com\r\nHost: 127.0.0.1\r\n\r\n", "400",
       "bad_request"},
      {"GET /healthz HTTP/1.1\r\n\r\n", "400", "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost:\r\n\r\n", "400", "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost: \r\n\r\n", "400", "bad_request"},
      {Raw("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\0.evil.com\r\n\r\n"), "400",
       "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost: [::1]evil.com\r\n\r\n", "400", "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:80:80\r\n\r\n", "400", "bad_request"},
      {"GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n", "400", "bad_request"},
  };
  for (const Case& c : cases) {
    int fd = Connect();
    Send(fd, c.request);
    std::string r = ReadToClose(fd);  // the error closes the connection
    EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 " + c.status)) << c.request.substr(0, 60) << r;
    EXPECT_EQ(Count(r, "Content-Type: "), 1) << r;  // one response: nothing smuggled behind
    EXPECT_TRUE(absl::StrContains(r, "\"code\":\"" + c.code + "\"")) << r;
    EXPECT_TRUE(absl::StrContains(r, "Connection: close")) << r;
    ::close(fd);
  }
  // The server is fine afterwards.
  ExpectHealthz();
}

TEST_F(EventServerTest, ExpectContinueGetsAnInterimResponse) {
  Start();
  int fd = Connect();
  Send(fd,
       "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer test-token-0123456789\r\n"
       "Expect: 100-continue\r\nContent-Length: 3\r\n\r\n");
  char buf[256];
  ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  Send(fd, "abc");
  std::string r = ReadResponses(fd, 1);
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 201")) << r;
  ::close(fd);
}

TEST_F(EventServerTest, SilentConnectionsAreClosedByTheReadTimeout) {
  ServerOptions o;
  o.read_timeout_ms = 800;
  Start(o);
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(Connect());
  // The silent connections are closed by the read timeout: recv sees EOF.
  for (int fd : idle) {
    EXPECT_EQ(ReadToClose(fd), "");
    ::close(fd);
  }
  ExpectHealthz();
}

TEST_F(EventServerTest, AFullBudgetEvictsIdleThenTricklingConnections) {
  ServerOptions o;
  o.max_connections = 2;
  o.read_timeout_ms = 60000;  // nothing here times out: only eviction closes connections
  o.header_timeout_ms = 60000;
  Start(o);
  // The budget fills with a connection trickling a request head and, younger, a silent one.
  int trickle1 = Connect();
  Send(trickle1, "GET /heal");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // ordering only: distinct ages
  int idle = Connect();
  WaitForOpenConnections(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // ordering only: bytes read
  // A new client is answered; the idle connection made room although the trickler is older.
  std::string r = FreshRequest("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  EXPECT_TRUE(ClosedByServer(idle));
  EXPECT_EQ(server_->metrics().connections_evicted.load(), 1u);
  // Two tricklers fill it again: the next newcomer takes the place of the older one.
  int trickle2 = Connect();
  Send(trickle2, "GET /he");
  WaitForOpenConnections(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // ordering only: bytes read
  r = FreshRequest(
      "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer test-token-0123456789\r\n"
      "Connection: close\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 201")) << r;
  EXPECT_TRUE(ClosedByServer(trickle1));
  EXPECT_EQ(server_->metrics().connections_evicted.load(), 2u);
  // The younger trickler was left alone and finishes its request.
  Send(trickle2, "althz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(ReadResponses(trickle2, 1), "HTTP/1.1 200"));
  ::close(idle);
  ::close(trickle1);
  ::close(trickle2);
}

TEST_F(EventServerTest, ABudgetOfBusyConnectionsAnswers503) {
  ServerOptions o;
  o.max_connections = 2;
  Start(o);
  std::vector<int> busy;
  for (int i = 0; i < 2; ++i) {
    busy.push_back(Connect());
    Send(busy.back(),
         "POST /block HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer test-token-0123456789\r\n"
         "Content-Length: 0\r\n\r\n");
  }
  WaitForOpenConnections(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // ordering only: both handled
  // Both connections are being answered: nothing can be evicted, the newcomer gets 503.
  std::string r = FreshRequest("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 503")) << r;
  EXPECT_TRUE(absl::StrContains(r, "too many connections")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Retry-After: 1")) << r;
  EXPECT_GE(server_->metrics().connections_rejected.load(), 1u);
  EXPECT_EQ(server_->metrics().connections_evicted.load(), 0u);
  unblock_.set_value();
  unblocked_ = true;
  for (int fd : busy) {
    EXPECT_TRUE(absl::StartsWith(ReadResponses(fd, 1), "HTTP/1.1 200"));
    ::close(fd);
  }
}

TEST_F(EventServerTest, ThePerClientCapEvictsThatClientsOwnConnections) {
  ServerOptions o;
  o.max_connections = 10;
  o.max_connections_per_client = 2;
  o.read_timeout_ms = 60000;
  o.header_timeout_ms = 60000;
  Start(o);
  int other = Connect();  // 127.0.0.1, the oldest connection of all
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // ordering only: distinct ages
  int first = Connect("127.0.0.2");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int second = Connect("127.0.0.2");
  WaitForOpenConnections(3);
  // 127.0.0.2 is at its cap: its third connection replaces its own oldest, not 127.0.0.1's.
  int third = Connect("127.0.0.2");
  Send(third, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(ReadResponses(third, 1), "HTTP/1.1 200"));
  EXPECT_TRUE(ClosedByServer(first));
  EXPECT_EQ(server_->metrics().connections_evicted.load(), 1u);
  for (int fd : {other, second}) {
    Send(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    EXPECT_TRUE(absl::StartsWith(ReadResponses(fd, 1), "HTTP/1.1 200"));
  }
  for (int fd : {other, first, second, third}) ::close(fd);
}

TEST_F(EventServerTest, TheHeadDeadlineDoesNotRestartOnEveryByte) {
  ServerOptions o;
  o.read_timeout_ms = 60000;  // each byte is progress: only the whole-head deadline can fire
  o.header_timeout_ms = 500;
  Start(o);
  int fd = Connect();
  std::string r = Trickle(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " +
                                  std::string(1000, 'a') + "\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 408")) << r;
  EXPECT_TRUE(absl::StrContains(r, "request head not received")) << r;
  EXPECT_GE(server_->metrics().requests_timed_out.load(), 1u);
  ::close(fd);
}

TEST_F(EventServerTest, TheBodyDeadlineDoesNotRestartOnEveryByte) {
  ServerOptions o;
  o.read_timeout_ms = 60000;
  o.body_timeout_ms = 500;
  Start(o);
  int fd = Connect();
  Send(fd,
       "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer test-token-0123456789\r\n"
       "Content-Length: 1000\r\n\r\n");
  std::string r = Trickle(fd, std::string(1000, 'b'));
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 408")) << r;
  EXPECT_TRUE(absl::StrContains(r, "request body not received")) << r;
  ::close(fd);
}

TEST_F(EventServerTest, DrainFinishesAHalfReceivedRequest) {
  Start();
  int busy = Connect();
  int idle = Connect();
  Send(idle, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(ReadResponses(idle, 1), "HTTP/1.1 200"));
  Send(busy,
       "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer test-token-0123456789\r\n"
       "Content-Length: 10\r\n\r\n01234");
  // Ordering only: let the loop read the first half before the drain starts.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::thread stopper([this] { server_->Shutdown(); });
  // The idle keep-alive connection is closed at once.
  EXPECT_EQ(ReadToClose(idle), "");
  Send(busy, "56789");
  std::string r = ReadToClose(busy);
  // The request had started (its head arrived before the drain): it is answered in full and
  // the connection closes.
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 201")) << r;
  EXPECT_TRUE(absl::StrContains(r, R"({"body":"0123456789"})")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Connection: close")) << r;
  stopper.join();
  thread_.join();
  EXPECT_TRUE(serve_status_.ok());
  server_.reset();
  ::close(busy);
  ::close(idle);
}

TEST_F(EventServerTest, AMutatingCallInProgressDoesNotStallReads) {
  ServerOptions o;
  o.event_threads = 1;  // one loop: a handler running on it would stall every connection
  Start(o);
  int writer = Connect();
  int reader = Connect();
  Send(writer,
       "POST /block HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer test-token-0123456789\r\n"
       "Content-Length: 0\r\n\r\n");
  // The POST's handler waits for unblock_; reads on the same loop are answered meanwhile.
  for (int i = 0; i < 3; ++i) {
    Send(reader, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    std::string r = ReadResponses(reader, 1);
    EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  }
  unblock_.set_value();
  unblocked_ = true;
  std::string r = ReadResponses(writer, 1);
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  EXPECT_TRUE(absl::StrContains(r, R"({"unblocked":true})")) << r;
  ::close(writer);
  ::close(reader);
}

TEST_F(EventServerTest, ABlockingReadDoesNotStallItsLoop) {
  ServerOptions o;
  o.event_threads = 1;  // one loop: a blob read on it would stall every connection
  Start(o);
  std::future<void> started = slow_started_.get_future();
  int slow = Connect();
  int reader = Connect();
  Send(slow, "GET /slow/7 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  // Bounded only so that a broken server fails the test instead of hanging it.
  ASSERT_EQ(started.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  // The slow read's handler is running (and waits for the release); the same loop answers
  // other requests on another connection meanwhile.
  for (int i = 0; i < 3; ++i) {
    Send(reader, "GET /echo?i=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    std::string r = ReadResponses(reader, 1);
    EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  }
  ReleaseSlow();
  std::string r = ReadResponses(slow, 1);
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  EXPECT_TRUE(absl::StrContains(r, R"({"n":"7","released":true})")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Connection: keep-alive")) << r;
  // HEAD on the blocking route: answered by the pool too, head only; the connection goes on.
  Send(slow, "HEAD /slow/8 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  r = ReadResponses(slow, 2);
  EXPECT_EQ(Count(r, "HTTP/1.1 200"), 2) << r;
  EXPECT_FALSE(absl::StrContains(r, "released")) << r;
  ::close(slow);
  ::close(reader);
}

TEST_F(EventServerTest, DrainFinishesABlockingRead) {
  Start();
  std::future<void> started = slow_started_.get_future();
  int slow = Connect();
  Send(slow, "GET /slow/1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  ASSERT_EQ(started.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  std::thread stopper([this] { server_->Shutdown(); });
  while (!server_->draining()) std::this_thread::yield();
  // The drain has begun; the read already started finishes and its answer goes out.
  ReleaseSlow();
  std::string r = ReadToClose(slow);
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  EXPECT_TRUE(absl::StrContains(r, R"("released":true)")) << r;
  stopper.join();
  thread_.join();
  EXPECT_TRUE(serve_status_.ok());
  server_.reset();
  ::close(slow);
}

TEST(EventServerQueryTest, DecodesLikeAFormParser) {
  auto q = ParseQueryString("a=1&a=2&b=%41%zz+&&c&=e");
  EXPECT_EQ(q.count("a"), 2u);
  EXPECT_EQ(q.find("b")->second, "A%zz ");
  EXPECT_EQ(q.find("c")->second, "");
  EXPECT_EQ(q.find("")->second, "e");
  EXPECT_EQ(DecodeQueryComponent("%2F%2f%"), "//%");
}

}  // namespace
}  // namespace loradb::http

namespace loradb::http {
namespace {

// Reads until `needle` has arrived (or the peer closed / 30 s passed).
std::string ReadUntil(int fd, const std::string& needle) {
  std::string buf;
  char chunk[8192];
  while (!absl::StrContains(buf, needle)) {
    ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
  }
  return buf;
}

TEST_F(EventServerTest, AStreamedReplyIsWrittenChunkByChunkThenTheConnectionIsReused) {
  Start();
  int fd = Connect();
  Send(fd, kStreamRequest);
  std::shared_ptr<ReplyStream> stream = StreamNumber(0);
  ASSERT_NE(stream, nullptr);
  std::string r = ReadUntil(fd, "\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200 OK\r\n")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Transfer-Encoding: chunked")) << r;
  EXPECT_FALSE(absl::StrContains(r, "Content-Length")) << r;
  // Each Send arrives as its own chunk before the next is produced.
  EXPECT_TRUE(stream->Send("data: one\n\n"));
  r = ReadUntil(fd, "data: one\n\n\r\n");
  EXPECT_TRUE(absl::StrContains(r, "b\r\ndata: one\n\n\r\n")) << r;
  EXPECT_TRUE(stream->Send(std::string(40000, 'x')));
  r = ReadUntil(fd, std::string(40000, 'x'));
  EXPECT_TRUE(absl::StartsWith(r, "9c40\r\n")) << r.substr(0, 20);
  stream->End();
  r = ReadUntil(fd, "0\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(r, "0\r\n\r\n")) << r;
  stream->Send("late");  // after End: dropped
  // Keep-alive: the same connection answers the next request, and nothing else came first.
  Send(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  r = ReadResponses(fd, 1);
  EXPECT_FALSE(absl::StrContains(r, "late")) << r;
  EXPECT_TRUE(absl::StartsWith(r, "\r\nHTTP/1.1 200") || absl::StartsWith(r, "HTTP/1.1 200"))
      << r;
  ::close(fd);
  EXPECT_FALSE(stream->cancelled());
}

TEST_F(EventServerTest, AClientThatClosesMidStreamCancelsIt) {
  Start();
  int fd = Connect();
  Send(fd, kStreamRequest);
  std::shared_ptr<ReplyStream> stream = StreamNumber(0);
  ASSERT_NE(stream, nullptr);
  EXPECT_TRUE(stream->Send("data: one\n\n"));
  ReadUntil(fd, "data: one");
  ::close(fd);
  EXPECT_TRUE(StreamCancelled(0));
  EXPECT_TRUE(stream->cancelled());
  EXPECT_FALSE(stream->Send("data: two\n\n"));
  ExpectHealthz();  // the server goes on
}

TEST_F(EventServerTest, AStreamTheClientDoesNotReadIsClosedByTheWriteTimeout) {
  ServerOptions o;
  o.write_timeout_ms = 300;
  Start(o);
  int fd = Connect();
  int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  Send(fd, kStreamRequest);
  std::shared_ptr<ReplyStream> stream = StreamNumber(0);
  ASSERT_NE(stream, nullptr);
  // More than the socket buffers hold, never read: the write stalls, the timeout closes it.
  for (int i = 0; i < 64 && stream->Send(std::string(1 << 20, 'x')); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(StreamCancelled(0));
  ::close(fd);
}

TEST_F(EventServerTest, ADeferredReplyIsWrittenWholeWhenAnswered) {
  Start();
  int fd = Connect();
  Send(fd,
       "POST /stream/deferred HTTP/1.1\r\nHost: 127.0.0.1\r\n"
       "Authorization: Bearer test-token-0123456789\r\nContent-Length: 0\r\n\r\n"
       "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  std::shared_ptr<ReplyStream> stream = StreamNumber(0);
  ASSERT_NE(stream, nullptr);
  EXPECT_TRUE(stream->Send("ignored"));  // a deferred reply has no body chunks
  stream->Answer(Reply::Json({{"answer", 42}}, 201));
  // The deferred reply, then the pipelined GET behind it, in order.
  std::string r = ReadResponses(fd, 2);
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 201 Created\r\n")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Content-Length: 13\r\n")) << r;
  EXPECT_TRUE(absl::StrContains(r, "{\"answer\":42}HTTP/1.1 200")) << r;
  ::close(fd);
  // A second deferred call whose client leaves before the answer: cancelled.
  fd = Connect();
  Send(fd,
       "POST /stream/deferred HTTP/1.1\r\nHost: 127.0.0.1\r\n"
       "Authorization: Bearer test-token-0123456789\r\nContent-Length: 0\r\n\r\n");
  ASSERT_NE(StreamNumber(1), nullptr);
  ::close(fd);
  EXPECT_TRUE(StreamCancelled(1));
  EXPECT_FALSE(stream->cancelled());  // answered in full: not cancelled work
}

TEST_F(EventServerTest, DrainWaitsForAStreamToEnd) {
  Start();
  int fd = Connect();
  Send(fd, kStreamRequest);
  std::shared_ptr<ReplyStream> stream = StreamNumber(0);
  ASSERT_NE(stream, nullptr);
  std::thread shutdown([this] { server_->Shutdown(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // ordering only: drain began
  EXPECT_TRUE(stream->Send("data: during drain\n\n"));
  stream->End();
  std::string r = ReadToClose(fd);
  EXPECT_TRUE(absl::StrContains(r, "data: during drain")) << r;
  EXPECT_TRUE(absl::StrContains(r, "0\r\n\r\n")) << r;
  shutdown.join();
  thread_.join();
  server_.reset();
  ::close(fd);
}

}  // namespace
}  // namespace loradb::http
