#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/formats/tensor.h"

namespace loradb {
namespace {

TensorView View(std::string name, size_t nbytes = 4) {
  return TensorView{std::move(name), DType::kU8, {static_cast<int64_t>(nbytes)}, nullptr, nbytes};
}

TEST(TensorSetTest, FindOnEmptySet) {
  TensorSet set;
  EXPECT_EQ(set.Find("a"), nullptr);
  EXPECT_EQ(set.Find(""), nullptr);
  set.Reserve(0);
  EXPECT_EQ(set.Find("a"), nullptr);
}

// The name index grows (with and without Reserve) and every name stays findable, short names
// (stored inside std::string) as well as long ones.
TEST(TensorSetTest, ManyNamesGrowTheIndex) {
  for (bool reserve : {false, true}) {
    TensorSet set;
    const int n = 5000;
    if (reserve) set.Reserve(n);
    for (int i = 0; i < n; ++i) {
      std::string name = i % 2 == 0 ? absl::StrCat(i)
                                    : absl::StrCat("base_model.model.model.layers.", i,
                                                   ".mlp.experts.7.gate_proj.lora_A.weight");
      ASSERT_TRUE(set.Add(View(name, static_cast<size_t>(i))).ok());
    }
    ASSERT_EQ(set.size(), static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      std::string name = i % 2 == 0 ? absl::StrCat(i)
                                    : absl::StrCat("base_model.model.model.layers.", i,
                                                   ".mlp.experts.7.gate_proj.lora_A.weight");
      const TensorView* v = set.Find(name);
      ASSERT_NE(v, nullptr) << name;
      EXPECT_EQ(v->nbytes, static_cast<size_t>(i));
      EXPECT_EQ(v, &set.tensors()[static_cast<size_t>(i)]);  // insertion order kept
    }
    EXPECT_EQ(set.Find("base_model.model.model.layers.1.mlp"), nullptr);
    EXPECT_EQ(set.Find("5000"), nullptr);
  }
}

TEST(TensorSetTest, DuplicateLeavesTheSetUnchanged) {
  TensorSet set;
  ASSERT_TRUE(set.Add(View("a", 1)).ok());
  ASSERT_TRUE(set.Add(View("", 2)).ok());  // the empty name is a name
  absl::Status dup = set.Add(View("a", 3));
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(dup.message().find("duplicate tensor name \"a\""), absl::string_view::npos);
  EXPECT_EQ(set.Add(View("", 4)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_EQ(set.size(), 2u);
  EXPECT_EQ(set.Find("a")->nbytes, 1u);
  EXPECT_EQ(set.Find("")->nbytes, 2u);
  ASSERT_TRUE(set.Add(View("b", 5)).ok());
  EXPECT_EQ(set.Find("b")->nbytes, 5u);
}

// The index holds positions, not pointers: copies and moves find their own views.
TEST(TensorSetTest, CopiesAndMovesKeepTheIndex) {
  TensorSet set;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(set.Add(View(absl::StrCat("t", i), i)).ok());
  TensorSet copy = set;
  TensorSet moved = std::move(set);
  for (int i = 0; i < 100; ++i) {
    std::string name = absl::StrCat("t", i);
    ASSERT_NE(copy.Find(name), nullptr);
    EXPECT_EQ(copy.Find(name), &copy.tensors()[static_cast<size_t>(i)]);
    ASSERT_NE(moved.Find(name), nullptr);
    EXPECT_EQ(moved.Find(name), &moved.tensors()[static_cast<size_t>(i)]);
  }
  // The copy grows on its own.
  ASSERT_TRUE(copy.Add(View("extra")).ok());
  EXPECT_NE(copy.Find("extra"), nullptr);
  EXPECT_EQ(moved.Find("extra"), nullptr);
  TensorSet assigned;
  ASSERT_TRUE(assigned.Add(View("old")).ok());
  assigned = copy;
  EXPECT_EQ(assigned.Find("old"), nullptr);
  EXPECT_NE(assigned.Find("extra"), nullptr);
  EXPECT_EQ(assigned.size(), 101u);
}

}  // namespace
}  // namespace loradb
