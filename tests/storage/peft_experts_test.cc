#include "storage/formats/peft_experts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

namespace loradb::peft {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kE = 3, kH = 4, kI = 2;

// A target_parameters adapter for one layer of a [E=3, H=4, I=2] Qwen3-MoE, laid out as peft
// saves it: gate_up_proj (rank 2) innermost, down_proj (rank 1) outermost.
struct FusedAdapter {
  std::vector<std::vector<float>> storage;
  TensorSet set;
  LoraConfig config;

  FusedAdapter() {
    config = *ParseLoraConfig(
        R"({"r":2,"lora_alpha":4,"target_modules":["q_proj"],"rank_pattern":{"down_proj":1},)"
        R"("target_parameters":["mlp.experts.down_proj","mlp.experts.gate_up_proj"]})");
    const std::string m = "model.layers.0.mlp.experts";
    Add(m + ".base_layer", LoraSide::kA, {2 * kE, kH}, 0);        // gate_up A [r*E, H]
    Add(m + ".base_layer", LoraSide::kB, {2 * kI, 2 * kE}, 100);  // gate_up B [2I, r*E]
    Add(m, LoraSide::kA, {1 * kE, kI}, 200);                      // down A [r*E, I]
    Add(m, LoraSide::kB, {kH, 1 * kE}, 300);                      // down B [H, r*E]
    Add("model.layers.0.self_attn.q_proj", LoraSide::kA, {2, kH}, 400);
    Add("model.layers.0.self_attn.q_proj", LoraSide::kB, {kH, 2}, 500);
  }
  void Add(const std::string& key, LoraSide side, std::vector<int64_t> shape, float base) {
    size_t n = static_cast<size_t>(shape[0] * shape[1]);
    storage.emplace_back(n);
    for (size_t i = 0; i < n; ++i) storage.back()[i] = base + static_cast<float>(i);
    ASSERT_TRUE(set.Add({PeftTensorNameFor(key, side, false), DType::kF32, std::move(shape),
                         reinterpret_cast<const std::byte*>(storage.back().data()), n * 4})
                    .ok());
  }
};

float At(const TensorView& t, int64_t row, int64_t col) {
  float v;
  std::memcpy(&v, t.data + (row * t.shape[1] + col) * 4, 4);
  return v;
}

const TensorView& Get(const TensorSet& s, const std::string& key, LoraSide side) {
  const TensorView* t = s.Find(PeftTensorNameFor(key, side, false));
  EXPECT_NE(t, nullptr) << key;
  static const TensorView kEmpty;
  return t ? *t : kEmpty;
}

TEST(PeftExpertsTest, UnfusesPerExpertAndFusesBackBitForBit) {
  FusedAdapter in;
  ASSERT_TRUE(ValidateLoraTensors(in.config, in.set.tensors()).ok());
  const ExpertsLayout layout = Qwen3MoeExpertsLayout(kE, kH, kI);
  LoraConfig per;
  auto out = UnfuseTargetParameters(in.config, in.set, layout, &per);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->size(), 2u + kE * 3 * 2);
  EXPECT_TRUE(per.target_parameters.empty());
  EXPECT_EQ(per.target_modules,
            (std::vector<std::string>{"q_proj", "gate_proj", "up_proj", "down_proj"}));
  ASSERT_TRUE(ValidateLoraTensors(per, out->tensors()).ok());

  const std::string m = "model.layers.0.mlp.experts";
  const TensorView& ga = Get(in.set, m + ".base_layer", LoraSide::kA);
  const TensorView& gb = Get(in.set, m + ".base_layer", LoraSide::kB);
  const TensorView& db = Get(in.set, m, LoraSide::kB);
  for (int64_t e = 0; e < kE; ++e) {
    const std::string ex = m + "." + std::to_string(e);
    for (const char* part : {"gate_proj", "up_proj"}) {
      const TensorView& a = Get(*out, ex + "." + part, LoraSide::kA);
      const TensorView& b = Get(*out, ex + "." + part, LoraSide::kB);
      ASSERT_EQ(a.shape, (std::vector<int64_t>{2, kH}));
      ASSERT_EQ(b.shape, (std::vector<int64_t>{kI, 2}));
      const int64_t row0 = std::string(part) == "up_proj" ? kI : 0;
      for (int64_t k = 0; k < 2; ++k) {
        for (int64_t i = 0; i < kH; ++i) EXPECT_EQ(At(a, k, i), At(ga, e * 2 + k, i));
        for (int64_t o = 0; o < kI; ++o) EXPECT_EQ(At(b, o, k), At(gb, row0 + o, k * kE + e));
      }
      // Each per-expert module keeps its parameter's rank and alpha.
      EXPECT_EQ(per.RankFor(ex + "." + part), 2);
    }
    const TensorView& b = Get(*out, ex + ".down_proj", LoraSide::kB);
    ASSERT_EQ(b.shape, (std::vector<int64_t>{kH, 1}));
    for (int64_t o = 0; o < kH; ++o) EXPECT_EQ(At(b, o, 0), At(db, o, e));
    EXPECT_EQ(per.RankFor(ex + ".down_proj"), 1);
  }

  auto back = FuseTargetParameters(in.config, *out, layout);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), in.set.size());
  for (const TensorView& t : in.set.tensors()) {
    const TensorView* got = back->Find(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    EXPECT_EQ(got->shape, t.shape) << t.name;
    ASSERT_EQ(got->nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(got->data, t.data, t.nbytes), 0) << t.name;
  }
}

TEST(PeftExpertsTest, PatternsKeepEachParametersRankAndAlpha) {
  FusedAdapter in;
  in.config = *ParseLoraConfig(
      R"({"r":2,"lora_alpha":4,"rank_pattern":{"down_proj":1},"alpha_pattern":)"
      R"({"gate_up_proj":7},"target_parameters":["mlp.experts.gate_up_proj","down_proj"]})");
  LoraConfig per;
  ASSERT_TRUE(
      UnfuseTargetParameters(in.config, in.set, Qwen3MoeExpertsLayout(kE, kH, kI), &per).ok());
  EXPECT_DOUBLE_EQ(per.AlphaFor("model.layers.0.mlp.experts.2.up_proj"), 7);
  EXPECT_DOUBLE_EQ(per.AlphaFor("model.layers.0.mlp.experts.2.down_proj"), 4);
  EXPECT_DOUBLE_EQ(per.AlphaFor("model.layers.0.self_attn.q_proj"), 4);
  auto json = per.ToJson();
  ASSERT_TRUE(json.ok());
  auto reparsed = ParseLoraConfig(*json);
  ASSERT_TRUE(reparsed.ok());
  EXPECT_TRUE(reparsed->target_parameters.empty());
  EXPECT_DOUBLE_EQ(reparsed->AlphaFor("model.layers.0.mlp.experts.1.gate_proj"), 7);
}

TEST(PeftExpertsTest, RefusesWhatTheBaseCannotHold) {
  FusedAdapter in;
  LoraConfig per;
  // A parameter the base does not have.
  LoraConfig bad = in.config;
  bad.target_parameters.push_back("mlp.experts.w13");
  auto r = UnfuseTargetParameters(bad, in.set, Qwen3MoeExpertsLayout(kE, kH, kI), &per);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("\"mlp.experts.w13\""));
  // An expert count that disagrees with the base.
  r = UnfuseTargetParameters(in.config, in.set, Qwen3MoeExpertsLayout(kE + 1, kH, kI), &per);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("but the base has 4 (num_experts)"));
  // Shapes that disagree with the parameter.
  r = UnfuseTargetParameters(in.config, in.set, Qwen3MoeExpertsLayout(kE, kH + 1, kI), &per);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("do not fit the base's"));

  // gate_proj and up_proj no longer sharing their A (as after training): no exact fused export.
  auto out = UnfuseTargetParameters(in.config, in.set, Qwen3MoeExpertsLayout(kE, kH, kI), &per);
  ASSERT_TRUE(out.ok());
  std::vector<TensorView> views = out->tensors();
  std::vector<float> changed(2 * kH, 0.5f);
  for (TensorView& v : views) {
    if (v.name == PeftTensorNameFor("model.layers.0.mlp.experts.1.up_proj", LoraSide::kA, false)) {
      v.data = reinterpret_cast<const std::byte*>(changed.data());
    }
  }
  TensorSet edited;
  for (TensorView& v : views) ASSERT_TRUE(edited.Add(v).ok());
  auto fused = FuseTargetParameters(in.config, edited, Qwen3MoeExpertsLayout(kE, kH, kI));
  EXPECT_EQ(fused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(fused.status().message()), HasSubstr("per-expert layout"));
}

}  // namespace
}  // namespace loradb::peft
