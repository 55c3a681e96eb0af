// The Store routes on the event-loop engine: a revision's tensors are read from its blob off the
// loop, so a blob read that blocks (here: the blob file replaced by a FIFO nobody writes yet)
// leaves the other connections of the same loop served.
#include "api/http/store_routes.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "api/http/server.h"
#include "storage/store/store.h"
#include "tests/storage/adapter_test_util.h"
#include "tests/test_util.h"

namespace loradb::http {
namespace {

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{30, 0};  // a broken server fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Sends `request` and reads one response (head + Content-Length body); "" on timeout.
std::string RoundTrip(int fd, const std::string& request) {
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string buf;
  char chunk[8192];
  for (;;) {
    size_t end = buf.find("\r\n\r\n");
    if (end != std::string::npos) {
      size_t cl = buf.find("Content-Length: ");
      size_t len = cl != std::string::npos && cl < end ? std::stoul(buf.substr(cl + 16)) : 0;
      if (buf.size() >= end + 4 + len) return buf;
    }
    ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return buf;
    buf.append(chunk, static_cast<size_t>(n));
  }
}

TEST(StoreRoutesTest, ABlobReadThatBlocksLeavesTheLoopServing) {
  testing::TempDir dir;
  auto opened = testing::OpenStoreWithPolicy(
      dir.file("store"), "tiny",
      R"({"modules": [{"name": "layers.0.self_attn.q_proj", "in": 8, "out": 16}]})",
      "acme/support");
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<Store> store = std::move(*opened);
  testing::Adapter a;
  a.Add("layers.0.self_attn.q_proj", false, 2, 8, 1.0f);
  a.Add("layers.0.self_attn.q_proj", true, 16, 2, 2.0f);
  auto rev = store->PublishTensors("acme/support", a.views, {});
  ASSERT_TRUE(rev.ok()) << rev.status();
  const std::string blob = store->BlobPath(rev->blob.hash);

  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.event_threads = 1;  // one loop: a blob read on it would stall every connection
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(AddStoreRoutes(store, server->get()).ok());
  ASSERT_TRUE((*server)->Bind().ok());
  absl::Status serve_status;
  std::thread serving([&] { serve_status = (*server)->Serve(); });
  // Stops the server however the test ends (a failed ASSERT returns early), first releasing a
  // read still blocked on the FIFO.
  struct Stop {
    Server* server;
    std::thread* serving;
    std::string fifo;
    ~Stop() {
      int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (w >= 0) ::close(w);
      server->Shutdown();
      serving->join();
    }
  } stop{server->get(), &serving, blob};

  const std::string tensors_req =
      absl::StrCat("GET /v1/revisions/", rev->id, "/tensors HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  int reader = Connect((*server)->port());
  std::string r = RoundTrip(reader, tensors_req);
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  EXPECT_TRUE(absl::StrContains(r, "lora_B.weight")) << r;

  // The blob becomes a FIFO: reading it blocks in open() until a writer appears.
  ASSERT_EQ(::unlink(blob.c_str()), 0);
  ASSERT_EQ(::mkfifo(blob.c_str(), 0644), 0);
  int slow = Connect((*server)->port());
  ASSERT_EQ(::send(slow, tensors_req.data(), tensors_req.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(tensors_req.size()));
  // The loop answers the next request (on a read on the loop, it would now be stuck in open()).
  r = RoundTrip(reader, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  ASSERT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  // Wait (bounded) until the read is blocked in open(): a writer can open the FIFO only then.
  int writer = -1;
  for (int i = 0; i < 30000 && writer < 0; ++i) {
    writer = ::open(blob.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (writer < 0) {
      ASSERT_EQ(errno, ENXIO);
      // While the read is blocked, the same loop answers other requests.
      std::string h = RoundTrip(reader, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
      ASSERT_TRUE(absl::StartsWith(h, "HTTP/1.1 200")) << h;
      std::string m = RoundTrip(reader, absl::StrCat("GET /v1/revisions/", rev->id,
                                                     " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
      ASSERT_TRUE(absl::StartsWith(m, "HTTP/1.1 200")) << m;
    }
  }
  ASSERT_GE(writer, 0) << "the tensors read never opened the blob";
  // The reader is blocked in (or past) open(); the loop still answers.
  r = RoundTrip(reader, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  // Closing the writer ends the read: a FIFO is no blob, so the answer is an error, not a hang.
  ::close(writer);
  r = RoundTrip(slow, "");
  EXPECT_FALSE(absl::StartsWith(r, "HTTP/1.1 200")) << r;
  EXPECT_TRUE(absl::StrContains(r, "\"error\"")) << r;

  ::close(reader);
  ::close(slow);
}

TEST(StoreRoutesTest, OnlyTheTensorsReadIsMarkedBlocking) {
  testing::TempDir dir;
  auto opened = Store::Open(dir.file("store"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  ServerOptions o;
  o.port = 0;
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE(AddStoreRoutes(std::move(*opened), server->get()).ok());
  int blocking = 0;
  for (const Route& route : (*server)->router()->routes()) {
    if (!route.blocking) continue;
    ++blocking;
    EXPECT_EQ(route.pattern, "/v1/revisions/{id}/tensors");
  }
  EXPECT_EQ(blocking, 1);
}

}  // namespace
}  // namespace loradb::http
