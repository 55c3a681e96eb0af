#include "storage/formats/synthetic.h"

#include <gtest/gtest.h>

#include <cstring>

#include "storage/formats/blob.h"
#include "storage/formats/peft.h"
#include "storage/store/store.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

TEST(SyntheticTest, SmallMoeAdapterHasPeftNamesAndShapes) {
  SyntheticMoeSpec spec;
  spec.layers = 2;
  spec.experts = 3;
  spec.rank = 2;
  auto set = MakeSyntheticMoeAdapter(spec);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->size(), spec.tensor_count());
  EXPECT_EQ(set->size(), 2u * 2 * (4 + 3 * 3));
  const TensorView* q = set->Find("base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{32 * 128, 2}));
  EXPECT_EQ(q->dtype, DType::kBF16);
  const TensorView* k = set->Find("base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{4 * 128, 2}));
  const TensorView* down =
      set->Find("base_model.model.model.layers.1.mlp.experts.2.down_proj.lora_A.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->shape, (std::vector<int64_t>{2, 768}));
  for (const TensorView& t : set->tensors()) {
    EXPECT_TRUE(peft::ParsePeftTensorName(t.name).ok()) << t.name;
  }
  // Packing gives one stored tensor per (layer, projection, A|B) plus the attention tensors.
  EXPECT_EQ(PlanMoePacking(set->tensors()).size(), 2u * 3 * 2);

  // Deterministic per seed, different across seeds, values small and finite (bf16 bits).
  auto same = MakeSyntheticMoeAdapter(spec);
  spec.seed = 2;
  auto other = MakeSyntheticMoeAdapter(spec);
  ASSERT_TRUE(same.ok() && other.ok());
  EXPECT_EQ(std::memcmp(set->tensors()[0].data, same->tensors()[0].data, set->tensors()[0].nbytes),
            0);
  EXPECT_NE(std::memcmp(set->tensors()[0].data, other->tensors()[0].data, set->tensors()[0].nbytes),
            0);
  uint16_t bits;
  std::memcpy(&bits, q->data, 2);
  EXPECT_LT(bits & 0x7f80, 0x3d80);  // exponent below that of 0.0625
}

TEST(SyntheticTest, TinyQProjAdapterFitsItsModuleTable) {
  const TensorSet set = MakeTinyQProjAdapter(7);
  ASSERT_EQ(set.size(), 2u);
  const TensorView* a = set.Find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  const TensorView* b = set.Find("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(b->shape, (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(b->nbytes, 32u * 4 * sizeof(float));
  float a3, b5;
  std::memcpy(&a3, a->data + 3 * sizeof(float), sizeof(float));
  std::memcpy(&b5, b->data + 5 * sizeof(float), sizeof(float));
  EXPECT_EQ(a3, 7.0f + 1.5f);
  EXPECT_EQ(b5, 7.0f - 1.25f);
  EXPECT_NE(std::memcmp(a->data, MakeTinyQProjAdapter(8).tensors()[0].data, a->nbytes), 0);

  testing::TempDir dir;
  auto store = Store::Open(dir.file("store"));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->AddBaseFromModuleTable("b", kTinyQProjModuleTable).ok());
  ASSERT_TRUE((*store)->CreatePolicy("p", "b").ok());
  auto rev = (*store)->PublishTensors("p", set.tensors(), PublishOptions{});
  EXPECT_TRUE(rev.ok()) << rev.status();
}

TEST(SyntheticTest, DefaultSpecIsQwen3_30B_A3B) {
  EXPECT_EQ(SyntheticMoeSpec{}.tensor_count(), 37248u);
}

TEST(SyntheticTest, RejectsBadSpecs) {
  SyntheticMoeSpec spec;
  spec.layers = 0;
  EXPECT_FALSE(MakeSyntheticMoeAdapter(spec).ok());
  spec = {};
  spec.dtype = DType::kI32;
  EXPECT_FALSE(MakeSyntheticMoeAdapter(spec).ok());
}

}  // namespace
}  // namespace loradb
