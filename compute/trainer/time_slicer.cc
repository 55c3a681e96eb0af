#include "compute/trainer/time_slicer.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <system_error>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "storage/util/mutex.h"

namespace loradb::trainer {
namespace {

// Shared state of one run; every field is guarded by `mu`.
class Schedule {
 public:
  Schedule(size_t k, int64_t steps, size_t cohort)
      : steps_(steps), cohort_(cohort), done_(k, 0), busy_(k, false), reports_(k) {}

  // Blocks until there is a cohort to run (returns its work indices, marked busy) or nothing is
  // left to do or the run failed (returns empty).
  std::vector<size_t> Take() {
    MutexLock lock(&mu_);
    while (true) {
      if (!status_.ok()) return {};
      std::vector<size_t> idle;
      bool left = false;
      for (size_t i = 0; i < done_.size(); ++i) {
        if (done_[i] < steps_) left = true;
        if (!busy_[i] && done_[i] < steps_) idle.push_back(i);
      }
      if (!left) return {};
      if (!idle.empty()) {
        std::stable_sort(idle.begin(), idle.end(),
                         [&](size_t a, size_t b) { return done_[a] < done_[b]; });
        if (idle.size() > cohort_) idle.resize(cohort_);
        for (size_t i : idle) busy_[i] = true;
        return idle;
      }
      // Every policy with steps left is busy: wait for a cohort to finish (Finish's unlock
      // wakes this wait).
      const int64_t finished = cohorts_finished_;
      mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return cohorts_finished_ != finished; });
    }
  }

  // Records the outcome of a cohort's step and frees its policies.
  void Finish(const std::vector<size_t>& cohort, absl::StatusOr<std::vector<StepReport>> r) {
    MutexLock lock(&mu_);
    if (r.ok()) {
      ++cohort_steps_;
      const StepReport& first = r->front();
      sample_s_ += first.sample_s;
      forward_backward_s_ += first.forward_backward_s;
      optim_s_ += first.optim_s;
      for (size_t j = 0; j < cohort.size(); ++j) {
        reports_[cohort[j]].push_back((*r)[j]);
        ++done_[cohort[j]];
      }
    } else if (status_.ok()) {
      status_ = r.status();
    }
    for (size_t i : cohort) busy_[i] = false;
    ++cohorts_finished_;
  }

  absl::StatusOr<TimeSliceResult> Result() {
    MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    TimeSliceResult out;
    out.reports = std::move(reports_);
    out.cohort_steps = cohort_steps_;
    out.sample_s = sample_s_;
    out.forward_backward_s = forward_backward_s_;
    out.optim_s = optim_s_;
    return out;
  }

 private:
  Mutex mu_;
  const int64_t steps_;
  const size_t cohort_;
  std::vector<int64_t> done_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<StepReport>> reports_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t cohort_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cohorts_finished_ ABSL_GUARDED_BY(mu_) = 0;  // Finish calls, failed ones included
  double sample_s_ ABSL_GUARDED_BY(mu_) = 0;
  double forward_backward_s_ ABSL_GUARDED_BY(mu_) = 0;
  double optim_s_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<TimeSliceResult> TrainTimeSliced(
    Trainer* trainer, const std::vector<std::pair<int, const Task*>>& work,
    const StepConfig& config, const TimeSliceOptions& options) {
  if (work.empty()) return absl::InvalidArgumentError("nothing to train");
  if (options.steps < 1 || options.workers < 1 || options.max_cohort < 0) {
    return absl::InvalidArgumentError(
        "time slicing needs steps >= 1, workers >= 1 and max_cohort >= 0");
  }
  std::set<int> seen;
  for (const auto& [policy, task] : work) {
    if (policy < 0 || policy >= trainer->num_policies() || task == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("bad work item for policy ", policy));
    }
    if (!seen.insert(policy).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy ", policy, " is listed twice: its steps cannot run at once"));
    }
  }
  const size_t k = work.size();
  const size_t workers = std::min<size_t>(static_cast<size_t>(options.workers), k);
  const size_t cohort = options.max_cohort > 0 ? static_cast<size_t>(options.max_cohort)
                                               : (k + workers - 1) / workers;
  Schedule schedule(k, options.steps, cohort);
  auto run = [&] {
    while (true) {
      std::vector<size_t> mine = schedule.Take();
      if (mine.empty()) return;
      std::vector<std::pair<int, const Task*>> part;
      for (size_t i : mine) part.push_back(work[i]);
      schedule.Finish(mine, TrainStep(trainer, part, config));
    }
  };
  std::vector<std::thread> threads;
  try {
    for (size_t w = 1; w < workers; ++w) threads.emplace_back(run);
  } catch (const std::system_error& e) {
    // Fewer workers than asked: the ones started and this thread still finish the run.
    std::fprintf(stderr, "time slicer: started %zu of %zu workers (%s)\n", threads.size() + 1,
                 workers, e.what());
  }
  run();
  for (std::thread& t : threads) t.join();
  return schedule.Result();
}

}  // namespace loradb::trainer
