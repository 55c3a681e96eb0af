// Tensor-parallel sharding: slices concatenate back to the whole (base and adapters, exact),
// rank/degree and head-divisibility validation, the reverse gather of adapter shards, and the
// two storage paths (slice at load from a whole blob, whole-verified or partial; the cached
// pre-sliced derived blob).
#include "tests/test_paths.h"
#include "compute/distributed/tp_shard.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compute/distributed/tp_decode.h"
#include "compute/distributed/tp_export.h"
#include "compute/distributed/tp_load.h"
#include "compute/model/checkpoint.h"
#include "storage/formats/blob.h"
#include "storage/util/file_util.h"
#include "tests/compute/tp_test_util.h"
#include "tests/test_util.h"

namespace loradb::distributed {
namespace {

ModelConfig TinyConfig(const std::string& name) {
  absl::StatusOr<ModelConfig> c =
      ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/" + name + ".json");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

at::Tensor AsTensor(const TensorView& v) {
  EXPECT_EQ(v.dtype, DType::kF32) << v.name;
  return at::from_blob(const_cast<std::byte*>(v.data), v.shape, at::kFloat);
}

bool SameBytes(const TensorView& a, const TensorView& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes &&
         std::memcmp(a.data, b.data, a.nbytes) == 0;
}

void ExpectSameSet(const TensorSet& got, const TensorSet& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const TensorView& w : want.tensors()) {
    const TensorView* g = got.Find(w.name);
    ASSERT_NE(g, nullptr) << w.name;
    EXPECT_TRUE(SameBytes(*g, w)) << w.name << " " << ShapeString(g->shape) << " vs "
                                  << ShapeString(w.shape);
  }
}

TEST(TpShard, AxesFollowColumnAndRowParallelRules) {
  EXPECT_EQ(BaseTensorAxis("model.layers.0.self_attn.q_proj.weight"), TpAxis::kOut);
  EXPECT_EQ(BaseTensorAxis("model.layers.0.self_attn.k_proj.bias"), TpAxis::kOut);
  EXPECT_EQ(BaseTensorAxis("model.layers.0.self_attn.o_proj.weight"), TpAxis::kIn);
  EXPECT_EQ(BaseTensorAxis("model.layers.0.self_attn.o_proj.bias"), TpAxis::kFirstRankOnly);
  EXPECT_EQ(BaseTensorAxis("model.layers.0.self_attn.q_norm.weight"), TpAxis::kReplicated);
  EXPECT_EQ(BaseTensorAxis("model.layers.1.mlp.experts.3.up_proj.weight"), TpAxis::kOut);
  EXPECT_EQ(BaseTensorAxis("model.layers.1.mlp.experts.3.down_proj.weight"), TpAxis::kIn);
  EXPECT_EQ(BaseTensorAxis("model.layers.1.mlp.gate.weight"), TpAxis::kReplicated);  // router
  EXPECT_EQ(BaseTensorAxis("model.embed_tokens.weight"), TpAxis::kReplicated);
  EXPECT_EQ(BaseTensorAxis("lm_head.weight"), TpAxis::kReplicated);
  const std::string p = "base_model.model.model.layers.2.";
  EXPECT_EQ(AdapterTensorAxis(p + "self_attn.v_proj.lora_B.weight"), TpAxis::kOut);
  EXPECT_EQ(AdapterTensorAxis(p + "self_attn.v_proj.lora_A.weight"), TpAxis::kReplicated);
  EXPECT_EQ(AdapterTensorAxis(p + "self_attn.o_proj.lora_A.weight"), TpAxis::kIn);
  EXPECT_EQ(AdapterTensorAxis(p + "self_attn.o_proj.lora_B.weight"), TpAxis::kReplicated);
  EXPECT_EQ(AdapterTensorAxis(p + "mlp.experts.up_proj.lora_B.weight"), TpAxis::kOut);  // packed
  EXPECT_EQ(AdapterTensorAxis(p + "mlp.experts.5.down_proj.lora_A.weight"), TpAxis::kIn);
  EXPECT_EQ(AdapterTensorAxis("not a peft name"), TpAxis::kReplicated);
}

TEST(TpShard, RankDegreeAndHeadValidation) {
  const ModelConfig c = TinyConfig("tiny-dense");  // 4 heads, 2 KV heads, intermediate 256
  EXPECT_TRUE(ValidateTpShard({0, 1}).ok());
  EXPECT_TRUE(ValidateTpShard({3, 4}).ok());
  EXPECT_EQ(ValidateTpShard({4, 4}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateTpShard({-1, 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateTpShard({0, 0}).code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<ModelConfig> two = TpLocalConfig(c, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->num_attention_heads, 2);
  EXPECT_EQ(two->num_key_value_heads, 1);
  EXPECT_EQ(two->intermediate_size, 128);
  EXPECT_EQ(two->hidden_size, c.hidden_size);
  EXPECT_EQ(two->head_dim, c.head_dim);

  absl::StatusOr<ModelConfig> four = TpLocalConfig(c, 4);
  ASSERT_FALSE(four.ok());
  EXPECT_EQ(four.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(four.status().message().find("num_key_value_heads"), std::string::npos)
      << four.status();
  absl::StatusOr<ModelConfig> three = TpLocalConfig(c, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("num_attention_heads"), std::string::npos)
      << three.status();

  // The shard functions refuse such a degree before touching any tensor.
  absl::StatusOr<TensorSet> adapter = MakeRandomLoraTensors(c, 4, 1);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(ShardAdapter(c, *adapter, {0, 4}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardAdapter(c, *adapter, {2, 2}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TpShard, BaseSlicesConcatenateToTheWhole) {
  for (const char* name : {"tiny-dense", "tiny-moe"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = TpConfig(name);
    TempDir dir;
    ASSERT_TRUE(model::WriteRandomCheckpoint(c, dir.file("m"), 3, at::kFloat).ok());
    absl::StatusOr<TensorSet> whole = model::ReadCheckpointTensors(dir.file("m"));
    ASSERT_TRUE(whole.ok()) << whole.status();
    for (int degree : {1, 2, 4}) {
      std::vector<TensorSet> shards;
      for (int r = 0; r < degree; ++r) {
        absl::StatusOr<TensorSet> s = ShardBaseCheckpoint(c, *whole, {r, degree});
        ASSERT_TRUE(s.ok()) << s.status();
        shards.push_back(std::move(*s));
      }
      for (const TensorView& w : whole->tensors()) {
        const TpAxis axis = BaseTensorAxis(w.name);
        absl::StatusOr<int> dim = TpSplitDim(axis, w.shape.size(), w.name);
        ASSERT_TRUE(dim.ok());
        std::vector<at::Tensor> parts;
        for (const TensorSet& s : shards) parts.push_back(AsTensor(*s.Find(w.name)));
        if (*dim < 0) {
          for (const at::Tensor& t : parts) EXPECT_TRUE(at::equal(t, AsTensor(w))) << w.name;
        } else {
          EXPECT_EQ(parts[0].size(*dim), w.shape[static_cast<size_t>(*dim)] / degree) << w.name;
          EXPECT_TRUE(at::equal(at::cat(parts, *dim), AsTensor(w))) << w.name;
        }
      }
    }
  }
}

TEST(TpShard, AdapterShardsGatherBackExactly) {
  for (const char* name : {"tiny-dense", "tiny-moe"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = TpConfig(name);
    absl::StatusOr<TensorSet> whole = MakeRandomLoraTensors(c, 4, 11);
    ASSERT_TRUE(whole.ok()) << whole.status();
    whole->metadata()["note"] = "kept";
    for (int degree : {1, 2, 4}) {
      std::vector<TensorSet> shards;
      for (int r = 0; r < degree; ++r) {
        absl::StatusOr<TensorSet> s = ShardAdapter(c, *whole, {r, degree});
        ASSERT_TRUE(s.ok()) << s.status();
        shards.push_back(std::move(*s));
      }
      // Column-parallel B and row-parallel A shrink; the other factor is whole on each rank.
      const std::string q_b = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
      const std::string o_a = "base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight";
      const std::string o_b = "base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight";
      EXPECT_EQ(shards[0].Find(q_b)->shape[0], whole->Find(q_b)->shape[0] / degree);
      EXPECT_EQ(shards[0].Find(o_a)->shape[1], whole->Find(o_a)->shape[1] / degree);
      EXPECT_EQ(shards[0].Find(o_b)->shape, whole->Find(o_b)->shape);
      std::vector<const TensorSet*> ptrs;
      for (const TensorSet& s : shards) ptrs.push_back(&s);
      absl::StatusOr<TensorSet> gathered = GatherAdapterShards(ptrs);
      ASSERT_TRUE(gathered.ok()) << gathered.status();
      ExpectSameSet(*gathered, *whole);
      EXPECT_EQ(gathered->metadata().at("note"), "kept");
    }
  }
}

TEST(TpShard, GatherRejectsInconsistentShards) {
  const ModelConfig c = TpConfig("tiny-dense");
  absl::StatusOr<TensorSet> whole = MakeRandomLoraTensors(c, 2, 5);
  ASSERT_TRUE(whole.ok());
  absl::StatusOr<TensorSet> s0 = ShardAdapter(c, *whole, {0, 2});
  absl::StatusOr<TensorSet> s1 = ShardAdapter(c, *whole, {1, 2});
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_EQ(GatherAdapterShards({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GatherAdapterShards({&*s0, nullptr}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A replicated factor that drifted on one rank (ranks trained apart) is refused.
  const std::string q_a = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight";
  auto* data = const_cast<std::byte*>(s1->Find(q_a)->data);
  data[0] = static_cast<std::byte>(static_cast<unsigned>(data[0]) ^ 1u);
  absl::StatusOr<TensorSet> drifted = GatherAdapterShards({&*s0, &*s1});
  ASSERT_FALSE(drifted.ok());
  EXPECT_NE(drifted.status().message().find(q_a), std::string::npos) << drifted.status();
  // Shards of different degrees do not line up.
  absl::StatusOr<TensorSet> other = ShardAdapter(c, *whole, {0, 4});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(GatherAdapterShards({&*s0, &*other}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TpShard, SliceRejectsIndivisibleTensor) {
  TensorSet set;
  std::vector<float> data(3 * 5, 1.0f);
  ASSERT_TRUE(set.Add(TensorView{"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
                                 DType::kF32,
                                 {3, 5},
                                 reinterpret_cast<const std::byte*>(data.data()),
                                 data.size() * 4})
                  .ok());
  absl::StatusOr<TensorSet> s = SliceTensors(set, AdapterTensorAxis, {0, 2});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("not divisible"), std::string::npos) << s.status();
}

// Whole blob on disk -> each rank's slice, by the three load paths; all equal ShardAdapter.
TEST(TpShard, BlobSliceAtLoadAndDerivedBlobAgree) {
  for (const char* name : {"tiny-dense", "tiny-moe"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = TpConfig(name);
    absl::StatusOr<TensorSet> whole = MakeRandomLoraTensors(c, 4, 21);
    ASSERT_TRUE(whole.ok());
    TempDir dir;
    const std::string blob = dir.file("whole.blob");
    absl::StatusOr<BlobFileInfo> info = WriteBlobFile(blob, whole->tensors(), {{"k", "v"}});
    ASSERT_TRUE(info.ok()) << info.status();
    for (int degree : {1, 2, 4}) {
      for (int r = 0; r < degree; ++r) {
        const TpShardSpec spec{r, degree};
        absl::StatusOr<TensorSet> want = ShardAdapter(c, *whole, spec);
        ASSERT_TRUE(want.ok());
        ShardReadStats full, part, derived_first, derived_again;
        absl::StatusOr<TensorSet> a =
            ReadAdapterShard(blob, c, spec, ShardReadMode::kWholeVerified, &full);
        ASSERT_TRUE(a.ok()) << a.status();
        ExpectSameSet(*a, *want);
        EXPECT_TRUE(full.verified);
        absl::StatusOr<TensorSet> b =
            ReadAdapterShard(blob, c, spec, ShardReadMode::kPartial, &part);
        ASSERT_TRUE(b.ok()) << b.status();
        ExpectSameSet(*b, *want);
        EXPECT_EQ(part.verified, degree == 1);
        if (degree > 1) {
          EXPECT_LT(part.bytes_read, full.bytes_read);
        }
        absl::StatusOr<TensorSet> d1 = LoadAdapterShardCached(
            blob, info->content_hash, dir.file("derived"), c, spec, &derived_first);
        ASSERT_TRUE(d1.ok()) << d1.status();
        EXPECT_FALSE(derived_first.from_derived);
        ExpectSameSet(*d1, *want);
        absl::StatusOr<TensorSet> d2 = LoadAdapterShardCached(
            blob, info->content_hash, dir.file("derived"), c, spec, &derived_again);
        ASSERT_TRUE(d2.ok()) << d2.status();
        EXPECT_TRUE(derived_again.from_derived);
        EXPECT_TRUE(derived_again.verified);
        ExpectSameSet(*d2, *want);
        EXPECT_EQ(d2->metadata().at("k"), "v");
        if (degree > 1) {
          EXPECT_LT(derived_again.bytes_read, full.bytes_read);
        }
      }
    }
  }
}

TEST(TpShard, DerivedBlobForAnotherRankIsRefused) {
  const ModelConfig c = TpConfig("tiny-dense");
  absl::StatusOr<TensorSet> whole = MakeRandomLoraTensors(c, 2, 8);
  ASSERT_TRUE(whole.ok());
  TempDir dir;
  const std::string blob = dir.file("whole.blob");
  absl::StatusOr<BlobFileInfo> info = WriteBlobFile(blob, whole->tensors(), {});
  ASSERT_TRUE(info.ok());
  const std::string cache = dir.file("derived");
  ASSERT_TRUE(LoadAdapterShardCached(blob, info->content_hash, cache, c, {1, 2}).ok());
  // Put rank 1's derived blob where rank 0's belongs: served by nobody.
  absl::StatusOr<std::string> bytes =
      ReadFileToString(DerivedShardPath(cache, info->content_hash, {1, 2}));
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(WriteFileAtomic(DerivedShardPath(cache, info->content_hash, {0, 2}), *bytes).ok());
  absl::StatusOr<TensorSet> bad =
      LoadAdapterShardCached(blob, info->content_hash, cache, c, {0, 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  // A missing whole blob is the file's error.
  EXPECT_EQ(
      ReadAdapterShard(dir.file("nope.blob"), c, {0, 2}, ShardReadMode::kPartial).status().code(),
      absl::StatusCode::kNotFound);
}

// Export: shards of a trained (here: random) adapter gather into a revision whose blob is the
// unsharded publish's blob, byte for byte (content-addressed: the same hash).
TEST(TpShard, GatheredShardsPublishTheUnshardedRevision) {
  for (const char* name : {"tiny-dense", "tiny-moe"}) {
    SCOPED_TRACE(name);
    TpFixture f(name);
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(f.options.store_dir);
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<TensorSet> whole = MakeRandomLoraTensors(f.config, 4, 99);
    ASSERT_TRUE(whole.ok());
    PublishOptions o;
    o.create_policy_base = "tiny";
    o.lora.r = 4;
    o.lora.alpha = 8;
    absl::StatusOr<RevisionRecord> direct = (*store)->PublishTensors("direct", whole->tensors(), o);
    ASSERT_TRUE(direct.ok()) << direct.status();
    for (int degree : {2, 4}) {
      std::vector<TensorSet> shards;
      std::vector<const TensorSet*> ptrs;
      for (int r = 0; r < degree; ++r) {
        absl::StatusOr<TensorSet> s = ShardAdapter(f.config, *whole, {r, degree});
        ASSERT_TRUE(s.ok()) << s.status();
        shards.push_back(std::move(*s));
      }
      for (const TensorSet& s : shards) ptrs.push_back(&s);
      absl::StatusOr<RevisionRecord> gathered =
          PublishGatheredAdapter(**store, absl::StrCat("gathered", degree), ptrs, o);
      ASSERT_TRUE(gathered.ok()) << gathered.status();
      EXPECT_EQ(gathered->blob.hash, direct->blob.hash);
      absl::StatusOr<TensorSet> back = (*store)->ReadTensors(*gathered);
      ASSERT_TRUE(back.ok()) << back.status();
      ExpectSameSet(*back, *whole);
    }
    // Inconsistent shards (a replicated factor drifted on rank 1) publish nothing.
    absl::StatusOr<TensorSet> s0 = ShardAdapter(f.config, *whole, {0, 2});
    absl::StatusOr<TensorSet> s1 = ShardAdapter(f.config, *whole, {1, 2});
    ASSERT_TRUE(s0.ok() && s1.ok());
    const std::string q_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    auto* data = const_cast<std::byte*>(s1->Find(q_a)->data);
    data[4] = static_cast<std::byte>(static_cast<unsigned>(data[4]) ^ 0x10u);
    EXPECT_EQ(PublishGatheredAdapter(**store, "bad", {&*s0, &*s1}, o).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*store)->GetPolicy("bad").status().code(), absl::StatusCode::kNotFound);
  }
}

}  // namespace
}  // namespace loradb::distributed
