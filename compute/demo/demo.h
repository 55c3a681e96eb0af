// The end-to-end demo (`loradb demo`, `tools/dev demo`): a tiny Qwen3 base generated with a fixed
// seed and registered in a store; four policies trained time-sliced on that one resident base on
// different toy tasks (SFT, DPO, GRPO), checkpointed and published as revisions as they go;
// one revision per policy promoted to `serving`; a mixed batch over all policies plus the base
// served by one decoder from the store's tiers; a rollback that changes what is served. The
// HTTP phase lives in tools/ (api/ sits above compute/) and is passed in as a callback.
//
// Torch-free header: the `loradb` command includes it.
#ifndef LORADB_COMPUTE_DEMO_DEMO_H_
#define LORADB_COMPUTE_DEMO_DEMO_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loradb {
class Store;
}

namespace loradb::demo {

struct DemoOptions {
  // The store directory. A previous demo store there is replaced; any other non-empty
  // directory is refused (FailedPrecondition), so the demo never deletes a user's data.
  std::string dir = "var/demo";
  uint64_t seed = 0;
  // Shortened run (fewer steps) for tests: the same phases, weaker learning.
  bool quick = false;
  // One line per event.
  std::function<void(const std::string&)> progress;
  // Phase 5, run with the open store after serving (the tools layer starts the HTTP endpoint
  // here). Its text is printed in the summary. May be empty.
  std::function<absl::StatusOr<std::string>(Store*)> http_phase;
};

struct PolicyOutcome {
  std::string policy;
  std::string task;   // mapping | preference | arithmetic
  std::string loss;   // sft | dpo | grpo
  int64_t steps = 0;  // optimizer steps trained
  int64_t checkpoints = 0;
  int64_t revisions = 0;
  uint64_t serving_revision = 0;  // what `serving` points at after training
  // Served through the decoder from `serving`, on the task's evaluation prompts:
  // mapping: exact-answer accuracy; arithmetic: mean partial-credit reward; preference: the
  // fraction of (chosen, rejected) token pairs the served logits rank the right way round.
  double served_score = 0;
  double base_score = 0;  // the same prompts served by the base without adapter
  // GRPO only (-1 otherwise): the mean reward of rollouts sampled at the training temperature
  // (100 prompts x 8, fixed seed) when the SFT warm start ends and after the GRPO steps.
  double sampled_reward_warm = -1;
  double sampled_reward_end = -1;
};

struct PhaseTime {
  std::string phase;
  double seconds = 0;
};

struct DemoResult {
  std::string store_dir;
  std::string model_dir;
  std::vector<PolicyOutcome> policies;
  // The rollback of phase 4.
  std::string rollback_policy;
  uint64_t rollback_from = 0, rollback_to = 0;
  double score_before_rollback = 0, score_after_rollback = 0;
  int64_t served_requests = 0;
  int64_t decoder_steps = 0;
  int64_t adapter_loads = 0;  // cold loads into the CPU tier
  int64_t cache_hits = 0;     // CPU-tier hits
  int64_t device_slots_used = 0;
  std::string http_report;
  std::vector<PhaseTime> phases;
  // The human-readable summary table.
  std::string Summary() const;
};

// Runs phases 1-6 (see the file comment). Deterministic for a given seed.
[[nodiscard]] absl::StatusOr<DemoResult> RunDemo(const DemoOptions& options);

}  // namespace loradb::demo

#endif  // LORADB_COMPUTE_DEMO_DEMO_H_
