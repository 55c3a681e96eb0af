#include "compute/distributed/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace loradb::dist {
namespace {

std::string Describe(const RankExit& e) {
  if (e.signal != 0) {
    return absl::StrCat("rank ", e.rank, " was killed by signal ", e.signal, " (",
                        strsignal(e.signal), ")");
  }
  return absl::StrCat("rank ", e.rank, " exited with status ", e.exit_code);
}

}  // namespace

absl::StatusOr<std::string> SelfExecutable() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return absl::InternalError(absl::StrCat("readlink /proc/self/exe: ", strerror(errno)));
  return std::string(buf, static_cast<size_t>(n));
}

absl::StatusOr<std::vector<std::string>> SelfCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  if (!in) return absl::InternalError("cannot read /proc/self/cmdline");
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  if (args.empty()) return absl::InternalError("empty /proc/self/cmdline");
  absl::StatusOr<std::string> self = SelfExecutable();
  if (!self.ok()) return self.status();
  args[0] = *self;
  return args;
}

absl::StatusOr<std::vector<RankExit>> LaunchRanks(const LaunchOptions& o) {
  if (o.argv.empty()) return absl::InvalidArgumentError("launch: empty argv");
  if (o.world_size < 1) return absl::InvalidArgumentError("launch: world size must be >= 1");

  std::string tmpdir;
  std::string rendezvous = o.rendezvous;
  if (rendezvous.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "loradb-dist-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
    }
    tmpdir = tmpl;
    rendezvous = absl::StrCat("file:", tmpdir, "/rendezvous");
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmpdir};

  // Everything the children need is built before fork (only async-signal-safe calls after).
  std::vector<char*> args;
  for (const std::string& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::vector<std::string>> envs(o.world_size);
  std::vector<std::vector<char*>> envps(o.world_size);
  for (int r = 0; r < o.world_size; ++r) {
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (entry.rfind("LORADB_RANK=", 0) == 0 || entry.rfind("LORADB_WORLD_SIZE=", 0) == 0 ||
          entry.rfind("LORADB_RENDEZVOUS=", 0) == 0 ||
          entry.rfind("LORADB_DIST_TIMEOUT_MS=", 0) == 0) {
        continue;
      }
      envs[r].push_back(entry);
    }
    envs[r].push_back(absl::StrCat("LORADB_RANK=", r));
    envs[r].push_back(absl::StrCat("LORADB_WORLD_SIZE=", o.world_size));
    envs[r].push_back(absl::StrCat("LORADB_RENDEZVOUS=", rendezvous));
    envs[r].push_back(absl::StrCat("LORADB_DIST_TIMEOUT_MS=", o.collective_timeout.count()));
    for (const std::string& e : o.env) envs[r].push_back(e);
    for (std::string& e : envs[r]) envps[r].push_back(e.data());
    envps[r].push_back(nullptr);
  }

  std::vector<pid_t> pids(o.world_size, -1);
  std::vector<RankExit> exits(o.world_size);
  // Each rank leads its own process group, so a stop reaches whatever it started too.
  auto kill_all = [&](int sig) {
    for (pid_t p : pids) {
      if (p > 0) kill(-p, sig);
    }
  };
  const pid_t launcher = getpid();
  for (int r = 0; r < o.world_size; ++r) {
    exits[r].rank = r;
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      kill_all(SIGKILL);
      for (pid_t p : pids) {
        if (p > 0) waitpid(p, nullptr, 0);
      }
      return absl::InternalError(absl::StrCat("fork: ", strerror(err)));
    }
    if (pid == 0) {
      setpgid(0, 0);
      // A rank must not outlive its launcher (Ctrl-C or a kill of the launcher stops the job).
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != launcher) _exit(128 + SIGTERM);
      if (r > 0 && o.quiet_followers) {
        const int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, STDOUT_FILENO);
      }
      execve(args[0], args.data(), envps[r].data());
      _exit(127);
    }
    setpgid(pid, pid);  // also here: no race with a stop before the child ran setpgid
    pids[r] = pid;
  }

  // Poll the children: the first failure stops the rest.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point term_sent{};
  bool stopping = false, deadline_hit = false;
  int first_failure = -1, running = o.world_size;
  while (running > 0) {
    bool reaped = false;
    int sweep_failure = -1;  // the root cause among the ranks that failed in this sweep
    for (int r = 0; r < o.world_size; ++r) {
      if (pids[r] <= 0) continue;
      int st = 0;
      const pid_t w = waitpid(pids[r], &st, WNOHANG);
      if (w == 0) continue;
      reaped = true;
      --running;
      pids[r] = -1;
      if (w < 0) {
        exits[r].exit_code = -1;
      } else if (WIFSIGNALED(st)) {
        exits[r].signal = WTERMSIG(st);
      } else {
        exits[r].exit_code = WEXITSTATUS(st);
      }
      exits[r].stopped_by_launcher = stopping;
      const bool failed = exits[r].signal != 0 || exits[r].exit_code != 0;
      // A rank killed by a signal is more likely the cause than one whose collective failed
      // because of it, when both are seen in one sweep.
      if (failed && !stopping &&
          (sweep_failure < 0 || (exits[sweep_failure].signal == 0 && exits[r].signal != 0))) {
        sweep_failure = r;
      }
    }
    if (sweep_failure >= 0) {
      first_failure = sweep_failure;
      stopping = true;
      term_sent = Clock::now();
      kill_all(SIGTERM);
    }
    if (running == 0) break;
    const Clock::time_point now = Clock::now();
    if (!stopping && o.deadline.count() > 0 && now - start > o.deadline) {
      deadline_hit = true;
      stopping = true;
      term_sent = now;
      kill_all(SIGTERM);
    }
    if (stopping && now - term_sent > o.grace) kill_all(SIGKILL);
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (deadline_hit) {
    return absl::DeadlineExceededError(absl::StrCat("the ", o.world_size,
                                                    " ranks did not finish within ",
                                                    o.deadline.count(), " ms; all were stopped"));
  }
  if (first_failure >= 0) {
    return absl::AbortedError(absl::StrCat(Describe(exits[first_failure]), "; the other ",
                                           o.world_size - 1, " rank(s) were stopped"));
  }
  return exits;
}

}  // namespace loradb::dist
