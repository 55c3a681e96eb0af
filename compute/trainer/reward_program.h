// A user's reward program for GRPO on a dataset (`loradb train --data FILE --reward-cmd CMD`):
// CMD runs once, through /bin/sh -c, for the whole training run. For each batch of rollouts
// loradb writes one JSON object per rollout on the program's stdin, one per line, and reads one
// reward per line from its stdout, in the same order: a JSON number (finite). The program must
// flush its stdout after each reward (Python: print(r, flush=True)). Its stderr is the
// caller's. docs/trainer.md defines the rollout object. No LibTorch here.
#ifndef LORADB_COMPUTE_TRAINER_REWARD_PROGRAM_H_
#define LORADB_COMPUTE_TRAINER_REWARD_PROGRAM_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loradb::trainer {

class RewardProgram {
 public:
  // Starts `command`. `timeout_s` bounds how long Score waits for the program to read or write
  // anything (> 0). Internal when the process cannot be started.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RewardProgram>> Start(
      const std::string& command, double timeout_s);

  // Closes the program's stdin and waits up to a second for it to exit, then kills it.
  ~RewardProgram();
  RewardProgram(const RewardProgram&) = delete;
  RewardProgram& operator=(const RewardProgram&) = delete;

  // Writes `rollouts` (each one JSON object without a newline) and returns the program's reward
  // for each. FailedPrecondition, naming the command and the rollout, when the program exits or
  // closes its stdout before answering every rollout (with its exit status), writes a line that
  // is not one finite number, writes more lines than rollouts, or stays silent for timeout_s.
  // After an error the program is stopped and every later call fails.
  [[nodiscard]] absl::StatusOr<std::vector<double>> Score(const std::vector<std::string>& rollouts);

  const std::string& command() const { return command_; }

 private:
  RewardProgram(std::string command, double timeout_s, pid_t pid, int fd)
      : command_(std::move(command)), timeout_s_(timeout_s), pid_(pid), fd_(fd) {}
  // Kills and reaps the program (if still running); returns how it ended, e.g. "exited with
  // status 3".
  std::string Stop(bool kill_now);
  absl::Status Fail(const std::string& message);

  std::string command_;
  double timeout_s_;
  pid_t pid_;
  int fd_;  // our end of the socket that is the program's stdin and stdout; -1 once stopped
  std::string pending_;  // bytes read past the last complete line
  std::string failure_;  // set once a call failed
};

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_REWARD_PROGRAM_H_
