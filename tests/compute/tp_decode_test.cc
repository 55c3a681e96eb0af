// Tensor-parallel decode: TP = 2 and 4 ranks give the same logits as TP = 1 (fp32 tolerance)
// with mixed adapters (several revisions + base rows) in every batch, dense and MoE. Here the
// ranks are threads summing through an in-process reducer (the math, without c10d); the same
// decode over Gloo with ranks as separate processes is TpGloo in tp_gloo_test.cc.
#include "tests/test_paths.h"
#include "compute/distributed/tp_decode.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compute/model/checkpoint.h"
#include "tests/compute/tp_test_util.h"
#include "tests/test_util.h"

namespace loradb::distributed {
namespace {

using ::loradb::testing::TempDir;

// Ranks as threads: every rank deposits its partial, the last one sums them in rank order
// (so all ranks get the very same tensor) and wakes the others.
class ThreadGroup {
 public:
  explicit ThreadGroup(int degree) : degree_(degree), parts_(static_cast<size_t>(degree)) {}

  at::Tensor Reduce(int rank, at::Tensor partial) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    parts_[static_cast<size_t>(rank)] = std::move(partial);
    if (++arrived_ == degree_) {
      at::Tensor sum = parts_[0].clone();
      for (int r = 1; r < degree_; ++r) sum.add_(parts_[static_cast<size_t>(r)]);
      result_ = sum;
      arrived_ = 0;
      ++gen_;
      ++calls_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
    return result_;
  }
  int64_t calls() const { return calls_; }

 private:
  const int degree_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<at::Tensor> parts_;
  at::Tensor result_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
  int64_t calls_ = 0;
};

class ThreadReducer : public model::PartialSumReducer {
 public:
  ThreadReducer(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}
  at::Tensor AllReduceSum(at::Tensor partial) const override {
    return group_->Reduce(rank_, std::move(partial));
  }

 private:
  ThreadGroup* group_;
  int rank_;
};

std::vector<TpDecodeResult> RunThreads(const TpDecodeOptions& options, int degree,
                                       int64_t* reduce_calls) {
  ThreadGroup group(degree);
  std::vector<absl::StatusOr<TpDecodeResult>> out(static_cast<size_t>(degree),
                                                  absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < degree; ++r) {
    threads.emplace_back([&, r] {
      ThreadReducer reducer(&group, r);
      out[static_cast<size_t>(r)] = RunTpDecode(options, {r, degree}, &reducer);
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<TpDecodeResult> results;
  for (auto& r : out) {
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) results.push_back(std::move(*r));
  }
  *reduce_calls = group.calls();
  return results;
}

void ExpectMatchesTp1(const std::string& name) {
  TpFixture f(name);
  ASSERT_EQ(f.options.revisions.size(), 3u);
  absl::StatusOr<TpDecodeResult> one = RunTpDecode(f.options, {0, 1}, nullptr);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->logits.size(), 5u);  // prefill + 4 steps
  // Adapters matter: the same decode without them gives other logits.
  TpDecodeOptions base_only = f.options;
  base_only.revisions.clear();
  absl::StatusOr<TpDecodeResult> base = RunTpDecode(base_only, {0, 1}, nullptr);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_GT(MaxRelErr(base->logits[0], one->logits[0]), 1e-3);

  for (int degree : {2, 4}) {
    SCOPED_TRACE(degree);
    int64_t calls = 0;
    std::vector<TpDecodeResult> ranks = RunThreads(f.options, degree, &calls);
    ASSERT_EQ(ranks.size(), static_cast<size_t>(degree));
    // Two reductions per layer per forward.
    EXPECT_EQ(calls, 2 * f.config.num_hidden_layers * 5);
    for (int r = 0; r < degree; ++r) {
      const TpDecodeResult& got = ranks[static_cast<size_t>(r)];
      EXPECT_EQ(got.local_heads, f.config.num_attention_heads / degree);
      EXPECT_EQ(got.tokens, one->tokens) << "rank " << r;
      ASSERT_EQ(got.logits.size(), one->logits.size());
      for (size_t step = 0; step < got.logits.size(); ++step) {
        EXPECT_LT(MaxRelErr(got.logits[step], one->logits[step]), 1e-4)
            << "rank " << r << " forward " << step;
      }
      // Every rank holds the same (replicated) logits.
      EXPECT_EQ(got.logits, ranks[0].logits) << "rank " << r;
      // The adapters came through the rank-placed device tier: its slots hold only the shard.
      EXPECT_EQ(got.adapter_whole_bytes, one->adapter_whole_bytes);
      EXPECT_GT(got.adapter_slot_bytes, 0u);
      EXPECT_LT(got.adapter_slot_bytes, one->adapter_slot_bytes) << "rank " << r;
    }
  }
}

TEST(TpDecode, DenseTp2AndTp4MatchTp1WithMixedAdapters) { ExpectMatchesTp1("tiny-dense"); }

TEST(TpDecode, MoeTp2AndTp4MatchTp1WithMixedAdapters) { ExpectMatchesTp1("tiny-moe"); }

TEST(TpDecode, BadOptionsAreRefused) {
  TpDecodeOptions o;
  o.model_dir = "/nonexistent";
  EXPECT_EQ(RunTpDecode(o, {0, 2}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunTpDecode(o, {2, 2}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  o.sequences = 0;
  EXPECT_EQ(RunTpDecode(o, {0, 1}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  // A base whose heads do not divide by the degree.
  TempDir dir;
  absl::StatusOr<ModelConfig> c =
      ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(model::WriteRandomCheckpoint(*c, dir.file("m"), 1, at::kFloat).ok());
  TpDecodeOptions bad;
  bad.model_dir = dir.file("m");
  ThreadGroup group(4);
  ThreadReducer reducer(&group, 0);
  absl::StatusOr<TpDecodeResult> r = RunTpDecode(bad, {0, 4}, &reducer);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("num_key_value_heads"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace loradb::distributed
