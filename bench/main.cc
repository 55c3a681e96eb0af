// loradb-bench SCENARIO [CASE] [--flags]; `loradb-bench all` runs every scenario.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

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

}  // namespace loradb::bench

namespace {

void Usage() {
  std::fprintf(stderr, "usage: loradb-bench SCENARIO [CASE] [--flags]\nscenarios:\n");
  std::fprintf(stderr, "  %-10s every scenario at sizes that fit this machine\n", "all");
  for (const auto& s : loradb::bench::ScenarioRegistry()) {
    std::fprintf(stderr, "  %-10s %s\n", s.name.c_str(), s.help.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    Usage();
    return argc < 2 ? 1 : 0;
  }
  std::string name = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  int failures = 0;
  for (const auto& s : loradb::bench::ScenarioRegistry()) {
    if (name != "all" && s.name != name) continue;
    loradb::bench::Progress("== " + s.name);
    absl::Status st = s.run(name == "all" ? s.all_args : args);
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", s.name.c_str(), std::string(st.message()).c_str());
      ++failures;
    }
    if (name != "all") return failures == 0 ? 0 : 1;
  }
  if (name != "all") {
    std::fprintf(stderr, "error: unknown scenario '%s'\n", name.c_str());
    Usage();
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
