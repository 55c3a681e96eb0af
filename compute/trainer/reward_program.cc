#include "compute/trainer/reward_program.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace loradb::trainer {
namespace {

// A short, printable excerpt of a line the program wrote.
std::string Excerpt(absl::string_view line) {
  std::string out;
  for (char c : line.substr(0, 80)) out.push_back(absl::ascii_isprint(c) ? c : '?');
  if (line.size() > 80) out += "...";
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RewardProgram>> RewardProgram::Start(const std::string& command,
                                                                    double timeout_s) {
  if (command.empty()) return absl::InvalidArgumentError("the reward command is empty");
  if (!(timeout_s > 0) || !std::isfinite(timeout_s)) {
    return absl::InvalidArgumentError("the reward program's timeout must be > 0 seconds");
  }
  // One socket serves as the program's stdin and stdout: writing to it after the program died
  // gives EPIPE (MSG_NOSIGNAL) instead of a SIGPIPE that would kill loradb.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, sv[1], STDOUT_FILENO);
  std::string sh = "sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, "/bin/sh", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(sv[1]);
  if (rc != 0) {
    ::close(sv[0]);
    return absl::InternalError(
        absl::StrCat("cannot start the reward program '", command, "': ", std::strerror(rc)));
  }
  return std::unique_ptr<RewardProgram>(new RewardProgram(command, timeout_s, pid, sv[0]));
}

RewardProgram::~RewardProgram() { Stop(false); }

std::string RewardProgram::Stop(bool kill_now) {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (pid_ <= 0) return "had stopped";
  if (kill_now) ::kill(pid_, SIGKILL);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 100 && done == 0; ++i) {
    done = ::waitpid(pid_, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(pid_, SIGKILL);
    done = ::waitpid(pid_, &status, 0);
  }
  pid_ = -1;
  if (done < 0) return "ended (its status is unknown)";
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "ended";
}

absl::Status RewardProgram::Fail(const std::string& message) {
  failure_ = message;
  return absl::FailedPreconditionError(message);
}

absl::StatusOr<std::vector<double>> RewardProgram::Score(const std::vector<std::string>& rollouts) {
  if (!failure_.empty()) return absl::FailedPreconditionError(failure_);
  const std::string who = absl::StrCat("reward program '", command_, "'");
  std::string out;
  for (const std::string& r : rollouts) {
    if (r.find('\n') != std::string::npos) {
      return absl::InvalidArgumentError("a rollout record holds a newline");
    }
    absl::StrAppend(&out, r, "\n");
  }
  const size_t n = rollouts.size();
  std::vector<double> rewards;
  size_t written = 0;
  const int timeout_ms = static_cast<int>(std::min(timeout_s_ * 1000.0, 2.0e9));
  char buf[1 << 16];
  while (rewards.size() < n) {
    pollfd p{fd_, static_cast<short>(POLLIN | (written < out.size() ? POLLOUT : 0)), 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      Stop(true);
      return Fail(absl::StrCat(who, ": poll: ", why));
    }
    if (ready == 0) {
      Stop(true);
      return Fail(absl::StrCat(who, " wrote no reward for ", timeout_s_, " s (waiting for rollout ",
                               rewards.size() + 1, " of ", n,
                               "); it must write one line per rollout and flush its stdout"));
    }
    if ((p.revents & POLLOUT) != 0 && written < out.size()) {
      const ssize_t sent =
          ::send(fd_, out.data() + written, out.size() - written, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent > 0) {
        written += static_cast<size_t>(sent);
      } else if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        // The program closed its stdin (or died): report how it ended.
        const std::string how = Stop(false);
        return Fail(absl::StrCat(who, " stopped reading rollouts after ", rewards.size(), " of ", n,
                                 " rewards; it ", how));
      }
    }
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    const ssize_t got = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      const std::string how = Stop(false);
      return Fail(absl::StrCat(who, " closed its output after ", rewards.size(), " of ", n,
                               " rewards; it ", how));
    }
    if (got == 0) {
      const std::string how = Stop(false);
      return Fail(absl::StrCat(who, " ", how, " after answering ", rewards.size(), " of ", n,
                               " rollouts of this batch"));
    }
    pending_.append(buf, static_cast<size_t>(got));
    size_t nl;
    while ((nl = pending_.find('\n')) != std::string::npos) {
      const std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      if (rewards.size() == n) {
        Stop(true);
        return Fail(absl::StrCat(who, " wrote more lines than the ", n, " rollouts it was sent (\"",
                                 Excerpt(line), "\")"));
      }
      double reward = 0;
      absl::string_view text = absl::StripAsciiWhitespace(line);
      if (!absl::SimpleAtod(text, &reward) || !std::isfinite(reward)) {
        Stop(true);
        return Fail(absl::StrCat(who, " wrote \"", Excerpt(line), "\" for rollout ",
                                 rewards.size() + 1, " of ", n,
                                 ": expected one finite number per line"));
      }
      rewards.push_back(reward);
    }
  }
  if (!pending_.empty()) {
    Stop(true);
    return Fail(absl::StrCat(who, " wrote more than the ", n, " reward lines it was asked for (\"",
                             Excerpt(pending_), "\")"));
  }
  return rewards;
}

}  // namespace loradb::trainer
