// The scratch-directory, loopback and child-command helpers of bench_util.h.
#include "bench/bench_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace loradb::bench {

ScopedBenchDir::ScopedBenchDir(const std::string& prefix)
    : path_(std::filesystem::temp_directory_path() / absl::StrCat(prefix, "-", getpid())) {
  std::filesystem::create_directories(path_);
}

ScopedBenchDir::~ScopedBenchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

int ConnectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

absl::StatusOr<JsonCommandResult> RunJsonCommand(const std::string& command,
                                                 const std::string& key) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot start: ", command));
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int rc = ::pclose(pipe);
  JsonCommandResult r;
  r.exit_status = rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && (key.empty() || j.contains(key))) r.last_object = std::move(j);
  }
  return r;
}

}  // namespace loradb::bench
