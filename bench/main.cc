// loradb-bench SCENARIO [CASE] [--flags]; `loradb-bench all [--quick] [--out FILE]` runs every
// scenario, each in its own child process, and collects their JSON lines into one results file
// with the machine's facts (see RunAll).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"

namespace loradb::bench {

std::vector<ScenarioDef>& ScenarioRegistry() {
  static auto* registry = new std::vector<ScenarioDef>();
  return *registry;
}

bool RegisterScenario(ScenarioDef def) {
  ScenarioRegistry().push_back(std::move(def));
  return true;
}

void Emit(const nlohmann::json& fields) { std::cout << fields.dump() << std::endl; }

void EmitGoal(const std::string& bench, const std::string& goal, double value,
              const std::string& target, bool met) {
  Emit({{"bench", bench}, {"goal", goal}, {"value", value}, {"target", target}, {"met", met}});
}

void Progress(const std::string& text) { std::cerr << text << std::endl; }

double Quantile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  size_t k = static_cast<size_t>(q * static_cast<double>(samples.size() - 1) + 0.5);
  k = std::min(k, samples.size() - 1);
  std::nth_element(samples.begin(), samples.begin() + static_cast<ptrdiff_t>(k), samples.end());
  return samples[k];
}

const char* SourceDir() { return LORADB_SOURCE_DIR_VALUE; }

}  // namespace loradb::bench

namespace {

using loradb::bench::Emit;
using loradb::bench::Progress;
using loradb::bench::ScenarioDef;
using loradb::bench::ScenarioRegistry;

const std::map<std::string, std::vector<std::string>>& QuickArgs() {
  // `all --quick`: every scenario at smoke sizes (about 3 minutes on 2 idle cores). The figures
  // are real measurements, but too small to judge a goal by; they exist so that the harness and
  // the report generator are exercised end to end.
  static const auto* quick = new std::map<std::string, std::vector<std::string>>{
      {"catalog", {"--revisions", "1000,10000"}},
      {"compact", {"--revisions", "10000"}},
      {"decode",
       {"all", "--batches=8", "--distinct=1,8", "--steps=2", "--rounds=1",
        absl::StrCat("--config=", LORADB_SOURCE_DIR, "/compute/configs/tiny-dense.json")}},
      {"formats", {"--layers", "8", "--reps", "1"}},
      {"http", {"--connections", "8", "--reads", "50", "--writes", "5"}},
      {"kernels", {"cpu", "--batches=1,16", "--min-seconds=0.05"}},
      {"replicate", {"--revisions", "1000", "--ops", "40"}},
      {"serve",
       {"all", "--clients=8", "--cliff-clients=4", "--slots=2", "--requests=1", "--tokens=4",
        "--peft-rows=2", "--peft-rounds=1",
        absl::StrCat("--config=", LORADB_SOURCE_DIR, "/compute/configs/tiny-dense.json")}},
      {"tiers", {"all", "--requests=20000", "--burst=4", "--moe=2"}},
      {"tinker",
       {"--config", "tiny-dense", "--batch", "8", "--length", "16", "--warmup", "1", "--steps",
        "2"}},
      {"train", {"--layers", "1", "--steps", "2"}},
  };
  return *quick;
}

void Usage() {
  std::fprintf(stderr,
               "usage: loradb-bench SCENARIO [CASE] [--flags]\n"
               "       loradb-bench all [--quick] [--out FILE] [--only A,B] [--skip A,B]\n"
               "                        [--timeout-s N]\n"
               "scenarios:\n");
  std::fprintf(
      stderr, "  %-10s every scenario at sizes that fit this machine (%s)\n", "all",
      "each in a child process; --out FILE: the JSON lines and machine facts also go to FILE");
  for (const auto& s : ScenarioRegistry()) {
    std::fprintf(stderr, "  %-10s %s\n", s.name.c_str(), s.help.c_str());
  }
}

// Reads a whole small file ("" when it cannot be read).
std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The 1, 5 and 15 minute load averages from /proc/loadavg (empty when unreadable).
std::vector<double> LoadAverage() {
  std::vector<double> out;
  std::vector<std::string> parts = absl::StrSplit(ReadSmallFile("/proc/loadavg"), ' ');
  for (size_t i = 0; i < parts.size() && i < 3; ++i) {
    double v = 0;
    if (absl::SimpleAtod(parts[i], &v)) out.push_back(v);
  }
  return out;
}

// First line of a shell command's stdout ("" on failure).
std::string CommandLine(const std::string& command) {
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return "";
  char buf[512];
  std::string out;
  if (std::fgets(buf, sizeof(buf), p) != nullptr) out = buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json MachineFacts() {
  nlohmann::json m = {{"bench", "all"}, {"case", "machine"}};
  // The first processor's name, family and model: a virtual machine's name is often only the
  // vendor's line ("AMD EPYC"), while the figures depend on the core generation behind it.
  std::string cpu, family, model;
  for (absl::string_view line : absl::StrSplit(ReadSmallFile("/proc/cpuinfo"), '\n')) {
    if (line.empty()) break;  // end of the first processor's block
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, colon));
    const std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    if (key == "model name") cpu = value;
    if (key == "cpu family") family = value;
    if (key == "model") model = value;
  }
  if (!family.empty() && !model.empty()) {
    absl::StrAppend(&cpu, " (family ", family, ", model ", model, ")");
  }
  m["cpu_model"] = cpu;
  m["cores"] = static_cast<int64_t>(::sysconf(_SC_NPROCESSORS_ONLN));
  int64_t mem_kib = 0;
  for (absl::string_view line : absl::StrSplit(ReadSmallFile("/proc/meminfo"), '\n')) {
    if (absl::StartsWith(line, "MemTotal:")) {
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() >= 2 && !absl::SimpleAtoi(f[1], &mem_kib)) mem_kib = 0;
    }
  }
  m["memory_bytes"] = mem_kib * 1024;
  struct utsname u {};
  if (::uname(&u) == 0) m["kernel"] = absl::StrCat(u.sysname, " ", u.release, " ", u.machine);
  m["compiler"] = __VERSION__;
  const std::string src = LORADB_SOURCE_DIR;
  m["git_commit"] = CommandLine("git -C '" + src + "' rev-parse HEAD 2>/dev/null");
  m["git_dirty"] =
      !CommandLine("git -C '" + src + "' status --porcelain --untracked-files=no 2>/dev/null")
           .empty();
  m["date_utc"] = UtcNow();
  m["loadavg_start"] = LoadAverage();
  std::vector<std::string> names;
  for (const auto& s : ScenarioRegistry()) names.push_back(s.name);
  m["scenarios_built"] = names;
  return m;
}

struct AllOptions {
  bool quick = false;
  std::string out;
  std::set<std::string> only, skip;
  int64_t timeout_s = 0;  // 0: 1800 s per scenario (300 with --quick)
};

bool ParseAllArgs(const std::vector<std::string>& args, AllOptions* o, std::string* error) {
  std::set<std::string> known;
  for (const auto& s : ScenarioRegistry()) known.insert(s.name);
  auto names = [&](const std::string& list, std::set<std::string>* out) {
    for (absl::string_view n : absl::StrSplit(list, ',', absl::SkipEmpty())) {
      if (known.count(std::string(n)) == 0) {
        *error =
            absl::StrCat("unknown scenario '", n, "' (built: ", absl::StrJoin(known, ","), ")");
        return false;
      }
      out->insert(std::string(n));
    }
    return true;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--quick") {
      o->quick = true;
    } else if (a == "--out" && has_value) {
      o->out = args[++i];
    } else if (a == "--only" && has_value) {
      if (!names(args[++i], &o->only)) return false;
    } else if (a == "--skip" && has_value) {
      if (!names(args[++i], &o->skip)) return false;
    } else if (a == "--timeout-s" && has_value) {
      if (!absl::SimpleAtoi(args[++i], &o->timeout_s) || o->timeout_s <= 0) {
        *error = "--timeout-s wants a positive number of seconds";
        return false;
      }
    } else {
      *error = absl::StrCat("bad argument to all: ", a,
                            " (flags: --quick --out FILE --only A,B --skip A,B --timeout-s N)");
      return false;
    }
  }
  return true;
}

struct ChildResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  int64_t lines = 0;
};

// The process group of the scenario running now (0: none), killed if `all` itself is
// interrupted, so that no scenario outlives it.
volatile sig_atomic_t g_child_group = 0;
// The signal that interrupted `all` (0: none); it stops after the running scenario is killed.
volatile sig_atomic_t g_interrupted = 0;

void KillChildAndStop(int sig) {
  g_interrupted = sig;
  if (g_child_group > 0) ::kill(-g_child_group, SIGKILL);
}

// Runs `self SCENARIO ARGS...` in its own process group with TMPDIR=`tmpdir`; every stdout line
// is passed to `on_line`; stderr (progress) is inherited. Kills the group after `timeout_s`.
ChildResult RunChild(const std::string& self, const std::string& scenario,
                     const std::vector<std::string>& args, const std::string& tmpdir,
                     int64_t timeout_s, const std::function<void(const std::string&)>& on_line) {
  ChildResult r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    on_line(nlohmann::json({{"bench", "all"}, {"case", "error"}, {"error", "pipe failed"}}).dump());
    return r;
  }
  std::vector<std::string> argv_s = {self, scenario};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::cout.flush();
  // The child's scratch files go to its own TMPDIR (every scenario puts them under
  // temp_directory_path()), so that runs on a shared machine do not collide.
  const char* old_tmp = std::getenv("TMPDIR");
  const std::string saved_tmp = old_tmp != nullptr ? old_tmp : "";
  ::setenv("TMPDIR", tmpdir.c_str(), 1);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(fds[1], STDOUT_FILENO);
    ::execv(self.c_str(), argv.data());
    std::fprintf(stderr, "exec %s failed: %s\n", self.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  if (old_tmp != nullptr) {
    ::setenv("TMPDIR", saved_tmp.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return r;
  }
  ::setpgid(pid, pid);
  g_child_group = pid;
  if (g_interrupted != 0) ::kill(-pid, SIGKILL);  // the signal came before the line above
  const double deadline = loradb::bench::NowSeconds() + static_cast<double>(timeout_s);
  std::string pending;
  char buf[65536];
  while (true) {
    const double left = deadline - loradb::bench::NowSeconds();
    if (left <= 0) {
      r.timed_out = true;
      ::kill(-pid, SIGTERM);
      std::this_thread::sleep_for(std::chrono::seconds(2));
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    ssize_t got = ::read(fds[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    pending.append(buf, static_cast<size_t>(got));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      on_line(pending.substr(0, nl));
      ++r.lines;
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty()) {
    on_line(pending);
    ++r.lines;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child_group = 0;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

// `all`: one child process per scenario (a crash, a leak or a hang in one does not take the
// others with it; each starts with a fresh heap). Every JSON line goes to stdout and, with
// --out, to the results file (truncated first), framed by a "machine" line and one "scenario" line
// per scenario (arguments, seconds, exit status) and an "end" line.
int RunAll(const std::vector<std::string>& args) {
  AllOptions o;
  std::string error;
  if (!ParseAllArgs(args, &o, &error)) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 2;
  }
  if (o.timeout_s == 0) o.timeout_s = o.quick ? 300 : 1800;
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) {
    std::fprintf(stderr, "error: cannot find this executable: %s\n", ec.message().c_str());
    return 1;
  }
  // The machine's facts (the git state included) before the results file is (re)written.
  nlohmann::json machine = MachineFacts();
  std::ofstream out;
  if (!o.out.empty()) {
    std::filesystem::path parent = std::filesystem::path(o.out).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    out.open(o.out, std::ios::out | std::ios::trunc);
    if (!out) {
      std::fprintf(stderr, "error: cannot write %s\n", o.out.c_str());
      return 1;
    }
  }
  auto write = [&](const std::string& line) {
    std::cout << line << std::endl;
    if (out.is_open()) out << line << std::endl;
  };
  std::string scratch =
      (std::filesystem::temp_directory_path(ec) / "loradb-bench-all-XXXXXX").string();
  if (ec || ::mkdtemp(scratch.data()) == nullptr) {
    std::fprintf(stderr, "error: cannot create a scratch directory %s\n", scratch.c_str());
    return 1;
  }
  ::signal(SIGINT, KillChildAndStop);
  ::signal(SIGTERM, KillChildAndStop);
  ::signal(SIGHUP, KillChildAndStop);
  const double start = loradb::bench::NowSeconds();
  machine["scratch_dir"] = scratch;
  machine["quick"] = o.quick;
  machine["command"] =
      absl::StrCat("loradb-bench all", args.empty() ? "" : " ", absl::StrJoin(args, " "));
  write(machine.dump());
  int failures = 0, ran = 0;
  for (const ScenarioDef& s : ScenarioRegistry()) {
    if (g_interrupted != 0) break;
    if (!o.only.empty() && o.only.count(s.name) == 0) continue;
    if (o.skip.count(s.name) != 0) continue;
    std::vector<std::string> sargs = s.all_args;
    if (o.quick) {
      auto q = QuickArgs().find(s.name);
      if (q != QuickArgs().end()) sargs = q->second;
    }
    Progress(absl::StrCat("== ", s.name, " ", absl::StrJoin(sargs, " ")));
    const double t0 = loradb::bench::NowSeconds();
    std::vector<double> load0 = LoadAverage();
    const std::string tmpdir = scratch + "/" + s.name;
    std::filesystem::create_directories(tmpdir, ec);
    ChildResult r =
        RunChild(self, s.name, sargs, tmpdir, o.timeout_s, [&](const std::string& line) {
          nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
          if (j.is_object()) {
            write(line);
          } else {
            write(nlohmann::json({{"bench", "all"},
                                  {"case", "stray_output"},
                                  {"scenario", s.name},
                                  {"text", line}})
                      .dump());
          }
        });
    const double seconds = loradb::bench::NowSeconds() - t0;
    std::filesystem::remove_all(tmpdir, ec);
    const bool ok = r.exit_code == 0 && !r.timed_out;
    ++ran;
    if (!ok) ++failures;
    write(nlohmann::json({{"bench", "all"},
                          {"case", "scenario"},
                          {"scenario", s.name},
                          {"args", sargs},
                          {"command", absl::StrCat("build/bench/loradb-bench ", s.name, " ",
                                                   absl::StrJoin(sargs, " "))},
                          {"seconds", seconds},
                          {"ok", ok},
                          {"exit_code", r.exit_code},
                          {"signal", r.signal},
                          {"timed_out", r.timed_out},
                          {"lines", r.lines},
                          {"loadavg_start", load0},
                          {"loadavg_end", LoadAverage()}})
              .dump());
    if (!ok) {
      std::fprintf(stderr, "error: scenario %s %s\n", s.name.c_str(),
                   r.timed_out ? absl::StrCat("timed out after ", o.timeout_s, " s").c_str()
                   : r.signal  ? absl::StrCat("killed by signal ", r.signal).c_str()
                               : absl::StrCat("exited with ", r.exit_code).c_str());
    }
  }
  std::filesystem::remove_all(scratch, ec);
  write(nlohmann::json({{"bench", "all"},
                        {"case", "end"},
                        {"date_utc", UtcNow()},
                        {"seconds", loradb::bench::NowSeconds() - start},
                        {"scenarios", ran},
                        {"failures", failures},
                        {"interrupted_by_signal", static_cast<int>(g_interrupted)},
                        {"loadavg_end", LoadAverage()}})
            .dump());
  if (out.is_open()) {
    out.close();
    if (!out) {
      std::fprintf(stderr, "error: writing %s failed\n", o.out.c_str());
      return 1;
    }
  }
  Progress(absl::StrCat("all: ", ran, " scenarios, ", failures, " failed, ",
                        static_cast<int64_t>(loradb::bench::NowSeconds() - start), " s"));
  if (g_interrupted != 0) return 128 + g_interrupted;
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    Usage();
    return argc < 2 ? 1 : 0;
  }
  std::string name = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (name == "all") return RunAll(args);
  for (const auto& s : ScenarioRegistry()) {
    if (s.name != name) continue;
    absl::Status st = s.run(args);
    if (absl::IsCancelled(st)) return 0;  // --help
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", s.name.c_str(), std::string(st.message()).c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "error: unknown scenario '%s'\n", name.c_str());
  Usage();
  return 1;
}
