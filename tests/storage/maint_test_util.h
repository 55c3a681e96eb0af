// Helpers for the maintenance tests: a small store with live, deleted, aliased and shared-blob
// revisions, a checkpoint and an orphan file; and a snapshot of what the API shows.
#ifndef LORADB_TESTS_STORAGE_MAINT_TEST_UTIL_H_
#define LORADB_TESTS_STORAGE_MAINT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/maintenance/maintenance.h"
#include "storage/maintenance/rebuild.h"
#include "storage/store/adapter_blob.h"
#include "storage/store/store.h"
#include "storage/util/file_util.h"
#include "tests/storage/adapter_test_util.h"

namespace loradb::maint_test {

using ::loradb::testing::Adapter;

// q_proj: in 8, out 16.
inline Adapter MakeAdapter(float seed) {
  Adapter a;
  a.Add("layers.0.self_attn.q_proj", false, 2, 8, seed);
  a.Add("layers.0.self_attn.q_proj", true, 16, 2, seed + 1);
  return a;
}

inline constexpr const char* kModuleTable =
    R"({"modules": [{"name": "layers.0.self_attn.q_proj", "in": 8, "out": 16}]})";

inline std::unique_ptr<Store> OpenStore(const std::string& dir) {
  auto s = Store::Open(dir);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

inline uint64_t Publish(Store& s, const std::string& policy, float seed,
                        const std::string& alias = "") {
  Adapter a = MakeAdapter(seed);
  PublishOptions o;
  o.alias = alias;
  auto r = s.PublishTensors(policy, a.views, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->id : 0;
}

// Builds the standard test store in `dir`: policies a/p (revisions 1..6) and b/q (7..9), alias
// a/p:serving moved twice, revisions 2 and 4 deleted, revision 9 deleted (the highest id),
// revision 8 sharing revision 7's blob, a checkpoint, and an orphan blob file.
inline void BuildStore(const std::string& dir) {
  auto s = OpenStore(dir);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->AddBaseFromModuleTable("tiny", kModuleTable).ok());
  ASSERT_TRUE(s->CreatePolicy("a/p", "tiny").ok());
  ASSERT_TRUE(s->CreatePolicy("b/q", "tiny").ok());
  for (int i = 1; i <= 6; ++i) Publish(*s, "a/p", static_cast<float>(i), i == 1 ? "serving" : "");
  ASSERT_TRUE(s->SetAlias("a/p", "serving", 3).ok());
  ASSERT_TRUE(s->SetAlias("a/p", "serving", 5).ok());
  Publish(*s, "b/q", 100.0f, "prod");
  Publish(*s, "b/q", 100.0f);  // same content: shares revision 7's blob
  Publish(*s, "b/q", 200.0f);
  for (uint64_t id : {2, 4, 9}) ASSERT_TRUE(s->DeleteRevision(id).ok()) << id;
  Adapter m = MakeAdapter(50.0f);
  CheckpointParts parts;
  parts.master = m.views;
  parts.rng_state = "rng";
  ASSERT_TRUE(s->PutCheckpoint("a/p", 10, 0, parts).ok());
  ASSERT_TRUE(CreateDirectories(s->blob_root() + "/zz/zz").ok());
  ASSERT_TRUE(WriteFileAtomic(s->blob_root() + "/zz/zz/orphan.blob", "left by a crash").ok());
}

// What the API shows: every live revision (id -> policy, seq, blob hash, tensor bytes checked),
// every alias, every checkpoint.
inline std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  StoreOptions o;
  o.create_if_missing = false;
  auto s = Store::Open(dir, o);
  if (!s.ok()) {
    out["error"] = std::string(s.status().message());
    return out;
  }
  auto policies = (*s)->ListPolicies();
  EXPECT_TRUE(policies.ok());
  if (!policies.ok()) return out;
  for (const PolicyRecord& p : *policies) {
    out[absl::StrCat("policy ", p.name)] = absl::StrCat(p.id, " next ", p.next_seq);
    auto revs = (*s)->ListRevisions(p.name, 0, 0);
    EXPECT_TRUE(revs.ok());
    if (!revs.ok()) continue;
    for (const RevisionRecord& r : revs->items) {
      auto t = (*s)->ReadTensors(r);
      out[absl::StrCat("rev ", r.id)] = absl::StrCat(p.name, "@", r.seq, " ", r.blob.hash.Hex(),
                                                     t.ok() ? " readable" : " UNREADABLE");
    }
    auto aliases = (*s)->ListAliases(p.name);
    EXPECT_TRUE(aliases.ok());
    if (!aliases.ok()) continue;
    for (const AliasEntry& a : *aliases)
      out[absl::StrCat("alias ", p.name, ":", a.alias)] = absl::StrCat(a.revision);
    auto cks = (*s)->catalog().ListCheckpoints(p.id);
    EXPECT_TRUE(cks.ok());
    if (!cks.ok()) continue;
    for (const CheckpointRecord& c : *cks) {
      auto t = (*s)->ReadCheckpointTensors(c.master);
      out[absl::StrCat("ckpt ", c.id)] =
          absl::StrCat(p.name, " step ", c.step, t.ok() ? " readable" : " UNREADABLE");
    }
  }
  return out;
}

// VerifyStore's problems joined (empty: consistent), or the error that stopped it.
inline std::string VerifyProblems(const std::string& dir) {
  auto rep = VerifyStore(dir, {});
  if (!rep.ok()) return absl::StrCat("verify failed: ", rep.status().message());
  std::string out;
  for (const auto& p : rep->problems) absl::StrAppend(&out, p, "\n");
  return out;
}

// Writes a v1 store: the catalog through the v1 writer, the blob files as the Store encodes them.
inline void WriteV1Store(const std::string& dir) {
  maint_internal::V1Catalog cat;
  BaseRecord base;
  base.name = "tiny";
  base.arch.family = "custom";
  base.modules = {{"layers.0.self_attn.q_proj", 8, 16}};
  base.created_us = 1700000000000000;
  cat.bases.push_back(base);
  PolicyRecord p;
  p.id = 1;
  p.name = "legacy/p";
  p.base = "tiny";
  p.created_us = base.created_us;
  p.next_seq = 5;
  cat.policies.push_back(p);
  std::map<std::pair<uint64_t, uint64_t>, BlobRecord> blobs;
  for (uint64_t id = 1; id <= 4; ++id) {
    Adapter a = MakeAdapter(id == 3 ? 1.0f : static_cast<float>(id));
    auto enc = EncodeAdapterBlob(a.views, {}, false);
    ASSERT_TRUE(enc.ok()) << enc.status();
    const std::string rel = BlobRelPath(enc->hash);
    ASSERT_TRUE(
        CreateDirectories(std::filesystem::path(dir + "/blobs/" + rel).parent_path().string())
            .ok());
    ASSERT_TRUE(WriteFileAtomic(dir + "/blobs/" + rel, enc->bytes).ok());
    RevisionRecord r;
    r.id = id;
    r.policy_id = 1;
    r.seq = id;
    r.base = "tiny";
    r.lora.r = 2;
    r.lora.alpha = 2;
    r.dtype = "F32";
    r.blob = BlobRef{enc->hash, enc->bytes.size(), 2};
    r.created_us = base.created_us + static_cast<int64_t>(id);
    r.state = id == 2 ? RevisionState::kDeleted : RevisionState::kLive;
    cat.revisions.push_back(r);
    BlobRecord& b = blobs[{enc->hash.high, enc->hash.low}];
    b.hash = enc->hash;
    b.relpath = rel;
    b.bytes = enc->bytes.size();
    if (r.state == RevisionState::kLive) ++b.refcount;
  }
  for (auto& [k, b] : blobs) cat.blobs.push_back(b);
  cat.aliases.push_back({1, "serving", 3});
  AliasLogEntry e;
  e.time_us = base.created_us + 10;
  e.to_revision = 1;
  e.reason = "publish";
  cat.alias_log.push_back({1, "serving", 1, e});
  e.time_us += 1;
  e.from_revision = 1;
  e.to_revision = 3;
  e.reason = "set";
  cat.alias_log.push_back({1, "serving", 2, e});
  ASSERT_TRUE(maint_internal::WriteV1Catalog(dir, cat).ok());
}

inline void CopyTree(const std::string& from, const std::string& to) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
}

}  // namespace loradb::maint_test

#endif  // LORADB_TESTS_STORAGE_MAINT_TEST_UTIL_H_
