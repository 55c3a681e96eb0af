// Tensor-parallel decode over torch.distributed Gloo with the ranks as separate
// processes on loopback (`loradb tp-decode --tp K`, the launcher in
// compute/distributed/launcher.h): TP = 2 and 4 give TP = 1's logits within
// fp32 tolerance and the same greedy tokens, with three revisions and base rows
// mixed in the batch, each rank reading only its slice of each revision's blob.
// A base whose KV heads do not divide by the degree fails with a clear error.
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_paths.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compute/distributed/process_group.h"
#include "nlohmann/json.hpp"
#include "tests/compute/tp_test_util.h"

namespace loradb::distributed {
namespace {

struct Decoded {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<float>> logits;
};

void ExpectTpMatchesTp1(const std::string& name) {
  SKIP_WITHOUT_C10D();
  TpFixture f(name);
  ASSERT_EQ(f.options.revisions.size(), 3u);
  const std::string common = absl::StrCat(
      "--model '", f.options.model_dir, "' --revisions ", absl::StrJoin(f.options.revisions, ","),
      " --sequences 8 --prompt-len 5", " --steps 4 --timeout-ms 60000");
  std::vector<Decoded> runs;
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE(tp);
    const std::string out = f.dir.file(absl::StrCat("tp", tp, ".json"));
    CliRun r = Cli(f.dir, f.options.store_dir,
                   absl::StrCat("tp-decode --tp ", tp, " ", common, " --out '", out, "'"));
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find(absl::StrCat("tp ", tp, ": 32 decode tokens")), std::string::npos)
        << r.out;
    nlohmann::json doc = nlohmann::json::parse(Slurp(out));
    EXPECT_EQ(doc["tp"].get<int>(), tp);
    EXPECT_EQ(doc["local_heads"].get<int>(), 8 / tp);
    runs.push_back({doc["tokens"].get<std::vector<std::vector<int64_t>>>(),
                    doc["logits"].get<std::vector<std::vector<float>>>()});
  }
  ASSERT_EQ(runs[0].logits.size(), 5u);
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].tokens, runs[0].tokens) << "run " << i;
    ASSERT_EQ(runs[i].logits.size(), runs[0].logits.size());
    for (size_t step = 0; step < runs[0].logits.size(); ++step) {
      EXPECT_LT(MaxRelErr(runs[i].logits[step], runs[0].logits[step]), 1e-4)
          << "run " << i << " forward " << step;
    }
  }
}

TEST(TpGloo, DenseTp2AndTp4MatchTp1AcrossProcesses) { ExpectTpMatchesTp1("tiny-dense"); }

TEST(TpGloo, MoeTp2AndTp4MatchTp1AcrossProcesses) { ExpectTpMatchesTp1("tiny-moe"); }

TEST(TpGloo, IndivisibleHeadsFailTheRunClearly) {
  SKIP_WITHOUT_C10D();
  TempDir dir;
  absl::StatusOr<ModelConfig> c =
      ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(model::WriteRandomCheckpoint(*c, dir.file("m"), 1, at::kFloat).ok());  // 2 KV heads
  CliRun r = Cli(dir, dir.file("store"),
                 absl::StrCat("tp-decode --tp 4 --model '", dir.file("m"), "' --timeout-ms 20000"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("num_key_value_heads = 2 is not divisible by the TP degree 4"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("tensor-parallel run aborted"), std::string::npos) << r.err;
}

// GPU (the script compute/distributed/check-on-gpu.sh runs these; they skip without NCCL and a
// CUDA device): TP decode with NCCL, the model on the rank's GPU and the adapters acquired
// through a CUDA device tier placed for the rank (slots hold the shard in device memory), gives
// the CPU Gloo run's logits; with two or more GPUs, TP 2 over NCCL does too, and so does an export
// gathered over NCCL.
void ExpectNcclMatchesCpu(int tp) {
  std::string why;
  if (!dist::NcclAvailable(&why)) GTEST_SKIP() << "no NCCL: " << why;
  if (tp > 1 && at::detail::getCUDAHooks().getNumGPUs() < tp)
    GTEST_SKIP() << "needs " << tp << " GPUs";
  TpFixture f("tiny-dense");
  const std::string common = absl::StrCat(
      "--model '", f.options.model_dir, "' --revisions ", absl::StrJoin(f.options.revisions, ","),
      " --sequences 8 --prompt-len 5 --steps 4 --timeout-ms 60000");
  std::vector<Decoded> runs;
  for (const std::string backend : {"gloo", "nccl"}) {
    const std::string out = f.dir.file(backend + ".json");
    CliRun r = Cli(f.dir, f.options.store_dir,
                   absl::StrCat("tp-decode --tp ", backend == "gloo" ? 1 : tp, " --backend ",
                                backend, " ", common, " --out '", out, "'"));
    ASSERT_EQ(r.rc, 0) << backend << ": " << r.err;
    nlohmann::json doc = nlohmann::json::parse(Slurp(out));
    runs.push_back({doc["tokens"].get<std::vector<std::vector<int64_t>>>(),
                    doc["logits"].get<std::vector<std::vector<float>>>()});
  }
  EXPECT_EQ(runs[1].tokens, runs[0].tokens);
  ASSERT_EQ(runs[1].logits.size(), runs[0].logits.size());
  for (size_t step = 0; step < runs[0].logits.size(); ++step) {
    EXPECT_LT(MaxRelErr(runs[1].logits[step], runs[0].logits[step]), 1e-3) << "forward " << step;
  }
}

TEST(TpGpu, NcclTp1OnTheCudaDeviceTierMatchesCpu) { ExpectNcclMatchesCpu(1); }

TEST(TpGpu, NcclTp2MatchesCpu) { ExpectNcclMatchesCpu(2); }

TEST(TpGpu, NcclExportTp2MatchesTheTp1Export) {
  std::string why;
  if (!dist::NcclAvailable(&why)) GTEST_SKIP() << "no NCCL: " << why;
  if (at::detail::getCUDAHooks().getNumGPUs() < 2) GTEST_SKIP() << "needs 2 GPUs";
  TpFixture f("tiny-dense");
  std::vector<std::string> hashes;
  for (int tp : {1, 2}) {
    CliRun r = Cli(f.dir, f.options.store_dir,
                   absl::StrCat("tp-export --tp ", tp, " --backend nccl --from-revision ",
                                f.options.revisions[0], " --policy gpu/tp", tp, " --json"));
    ASSERT_EQ(r.rc, 0) << r.err;
    hashes.push_back(nlohmann::json::parse(r.out)["blob_hash"].get<std::string>());
  }
  EXPECT_EQ(hashes[1], hashes[0]);
}

}  // namespace
}  // namespace loradb::distributed
