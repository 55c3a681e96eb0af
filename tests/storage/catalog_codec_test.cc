// Catalog records decoded from unaligned bytes, as LMDB hands them out (values are only 2-byte
// aligned). Regression test for the ASan+UBSan finding "load of misaligned address ... for type
// 'uoffset_t'" in CatalogTest.AliasesLogAndRollback: FlatBuffers reads scalars in place, so
// the decoder copies a misaligned record before reading it. The normal build shows the values;
// the sanitizer build (tools/dev test --asan) fails on the undefined load without the copy.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "storage/catalog/codec.h"
#include "storage/catalog/codec_tables.h"

namespace loradb::catalog_codec {
namespace {

// `record` copied to each offset 0..7 of an 8-byte aligned buffer.
std::vector<std::vector<uint64_t>> AtEveryOffset(const std::string& record) {
  std::vector<std::vector<uint64_t>> out;
  for (size_t off = 0; off < 8; ++off) {
    std::vector<uint64_t> buf((record.size() + off + 7) / 8 + 1, 0);
    std::memcpy(reinterpret_cast<uint8_t*>(buf.data()) + off, record.data(), record.size());
    out.push_back(std::move(buf));
  }
  return out;
}

Bytes At(const std::vector<uint64_t>& buf, size_t off, size_t size) {
  return Bytes(reinterpret_cast<const uint8_t*>(buf.data()) + off, size);
}

TEST(CatalogCodecTest, DecodesRecordsAtAnyAlignment) {
  AliasLogEntry log;
  log.time_us = 1234567890123;
  log.from_revision = 7;
  log.to_revision = 9;
  log.reason = "rollback";
  const std::string log_bytes = EncodeAliasLogEntry(log);
  RevisionRecord rev;
  rev.id = 42;
  rev.policy_id = 3;
  rev.seq = 5;
  rev.base = "tiny";
  rev.lora.r = 8;
  rev.blob.hash = Hash128{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  rev.blob.bytes = 4096;
  rev.created_us = 99;
  const std::string rev_bytes = EncodeRevision(rev, "another-base");
  auto logs = AtEveryOffset(log_bytes);
  auto revs = AtEveryOffset(rev_bytes);
  for (size_t off = 0; off < 8; ++off) {
    auto l = DecodeAliasLogEntry(At(logs[off], off, log_bytes.size()));
    ASSERT_TRUE(l.ok()) << "offset " << off << ": " << l.status();
    EXPECT_EQ(l->time_us, log.time_us) << off;
    EXPECT_EQ(l->from_revision, 7u) << off;
    EXPECT_EQ(l->to_revision, 9u) << off;
    EXPECT_EQ(l->reason, "rollback") << off;
    auto r = DecodeRevision(At(revs[off], off, rev_bytes.size()), 42);
    ASSERT_TRUE(r.ok()) << "offset " << off << ": " << r.status();
    EXPECT_EQ(r->id, 42u) << off;
    EXPECT_EQ(r->seq, 5u) << off;
    EXPECT_EQ(r->base, "tiny") << off;
    EXPECT_EQ(r->lora.r, 8) << off;
    EXPECT_TRUE(r->blob.hash == rev.blob.hash) << off;
    EXPECT_EQ(r->blob.bytes, 4096u) << off;
    EXPECT_EQ(r->created_us, 99) << off;
  }
  // A truncated record is still refused (the copy does not hide corruption).
  auto bad = DecodeRevision(At(revs[3], 3, rev_bytes.size() / 2), 42);
  EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
}

// Layout 4 (written since schema v7), layout 3 (v6), layout 2 (v4-v5) and layout 1 (read from
// older stores) hold the same record; layouts 2-4 leave the id to the key, layout 4 the base to
// the policy when it is the policy's, and each is smaller than the one before.
TEST(CatalogCodecTest, RevisionLayoutsReadTheSame) {
  RevisionRecord rev;
  rev.id = 7;
  rev.policy_id = 3;
  rev.seq = 2;
  rev.base = "qwen3-4b";
  rev.parent = 6;
  rev.source.kind = SourceKind::kImported;
  rev.source.checkpoint_id = 11;
  rev.source.step = 120;
  rev.source.origin = "hf://org/a";
  rev.source.content_hash = "00112233445566778899aabbccddeeff";
  rev.lora.r = 16;
  rev.lora.alpha = 32.5f;
  rev.lora.use_rslora = true;
  rev.lora.modules = {{"q_proj", 8, 4.0f, true}};
  rev.lora.target_modules = {"q_proj", "v_proj"};
  rev.dtype = "BF16";
  rev.layout = Layout::kPacked;
  rev.blob = {Hash128{0x1234, 0x5678}, 4096, 112};
  rev.created_us = 1700000000000001;
  rev.state = RevisionState::kDeleted;
  rev.evals = {{"acc", 0.5f}};
  const std::string v1 = EncodeRevisionLayout1(rev);
  const std::string v2 = EncodeRevisionLayout2(rev);
  const std::string v3 = EncodeRevisionLayout3(rev);
  const std::string v4 = EncodeRevision(rev, "qwen3-4b");
  EXPECT_LT(v2.size(), v1.size());
  EXPECT_LT(v3.size(), v2.size());
  EXPECT_LT(v4.size(), v3.size());
  auto a = DecodeRevision(At(AtEveryOffset(v1)[0], 0, v1.size()), 99);
  auto b = DecodeRevision(At(AtEveryOffset(v2)[0], 0, v2.size()), 7);
  auto c = DecodeRevision(At(AtEveryOffset(v3)[0], 0, v3.size()), 7);
  uint64_t asked = 0;
  auto d = DecodeRevision(At(AtEveryOffset(v4)[0], 0, v4.size()), 7,
                          [&](uint64_t policy_id) -> absl::StatusOr<std::string> {
                            asked = policy_id;
                            return "qwen3-4b";
                          });
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(asked, 3u);  // the record's policy
  // Without the policy's base, a layout-4 record that leaves it to the policy is not read.
  auto e = DecodeRevision(At(AtEveryOffset(v4)[0], 0, v4.size()), 7);
  EXPECT_TRUE(absl::IsFailedPrecondition(e.status())) << e.status();
  for (const RevisionRecord* r : {&*a, &*b, &*c, &*d}) {
    EXPECT_EQ(r->id, 7u);  // layout 1: the stored id; layouts 2 and 3: the key
    EXPECT_EQ(r->policy_id, 3u);
    EXPECT_EQ(r->seq, 2u);
    EXPECT_EQ(r->base, "qwen3-4b");
    EXPECT_EQ(r->parent, 6u);
    EXPECT_EQ(r->source.kind, SourceKind::kImported);
    EXPECT_EQ(r->source.checkpoint_id, 11u);
    EXPECT_EQ(r->source.step, 120u);
    EXPECT_EQ(r->source.origin, "hf://org/a");
    EXPECT_EQ(r->source.content_hash, rev.source.content_hash);
    EXPECT_EQ(r->lora, rev.lora);
    EXPECT_EQ(r->dtype, "BF16");
    EXPECT_EQ(r->layout, Layout::kPacked);
    EXPECT_TRUE(r->blob.hash == rev.blob.hash);
    EXPECT_EQ(r->blob.bytes, 4096u);
    EXPECT_EQ(r->blob.tensors, 112u);
    EXPECT_EQ(r->created_us, rev.created_us);
    EXPECT_EQ(r->state, RevisionState::kDeleted);
    EXPECT_EQ(r->evals, rev.evals);
  }
  EXPECT_EQ(*DecodeRevisionState(At(AtEveryOffset(v2)[0], 0, v2.size())), RevisionState::kDeleted);
  EXPECT_EQ(*DecodeRevisionState(At(AtEveryOffset(v3)[0], 0, v3.size())), RevisionState::kDeleted);
}

RevisionRecord RoundTrip(const RevisionRecord& rev, size_t* size = nullptr) {
  const std::string bytes = EncodeRevision(rev, "policy-base");
  if (size != nullptr) *size = bytes.size();
  auto r = DecodeRevision(At(AtEveryOffset(bytes)[0], 0, bytes.size()), rev.id);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RevisionRecord{};
}

// Layout 3 keeps a usual dtype as a code and a target-module list as bits only where the bits give
// back exactly that list; every other dtype and list is stored as written and reads back so.
TEST(CatalogCodecTest, Layout3ReadsBackEveryDtypeAndTargetList) {
  RevisionRecord rev;
  rev.id = 1;
  rev.policy_id = 1;
  rev.seq = 1;
  rev.base = "qwen3-4b";
  rev.lora.r = 16;
  rev.lora.alpha = 32;
  const std::vector<std::vector<std::string>> lists = {
      {},
      {"q_proj", "v_proj"},                                                           // bits
      {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},  // bits
      {"v_proj", "q_proj"},        // another order: strings
      {"q_proj", "q_proj"},        // a repeat: strings
      {"q_proj", "experts.0.w1"},  // a name outside the table: strings
      {"embed_tokens"},            // strings
      {""},                        // an empty name: strings
  };
  size_t bits_size = 0, strings_size = 0;
  for (const auto& list : lists) {
    for (const std::string dtype : {"", "F32", "BF16", "F16", "BOOL", "F8_E4M3", "Q4_K", "bf16"}) {
      rev.lora.target_modules = list;
      rev.dtype = dtype;
      size_t size = 0;
      const RevisionRecord r = RoundTrip(rev, &size);
      EXPECT_EQ(r.lora.target_modules, list) << dtype;
      EXPECT_EQ(r.dtype, dtype);
      if (dtype == "BF16" && list.size() == 2 && list[0] == "q_proj") {
        (list[1] == "v_proj" ? bits_size : strings_size) = size;
      }
    }
  }
  // Folded into the fixed struct, the two strings and their vector cost nothing.
  EXPECT_GT(strings_size, bits_size + 20);
}

// A layout-3 record whose code or bits this build does not know, or that stores a field both as
// a code and as a string, is refused by name instead of read with a wrong value.
TEST(CatalogCodecTest, Layout3RefusesUnknownCodesAndFieldsStoredTwice) {
  auto build = [](uint8_t dtype_code, uint32_t mask, bool dtype_string, bool target_strings) {
    flatbuffers::FlatBufferBuilder b;
    auto dtype = dtype_string ? b.CreateString("F32") : flatbuffers::Offset<flatbuffers::String>();
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> targets;
    if (target_strings) targets = b.CreateVectorOfStrings({"q_proj"});
    const fb::RevisionFixed3 fixed(1, 1, 0, 0, 0, 0, 0, fb::Hash128(0, 0), 0, 8, 16.0f, mask,
                                   fb::SourceKind::Trained, fb::Layout::Plain,
                                   fb::RevisionState::Live, false, dtype_code);
    b.Finish(fb::CreateRevisionV3(b, 3, &fixed, 0, dtype, targets));
    return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
  };
  auto decode = [](const std::string& bytes) {
    return DecodeRevision(At(AtEveryOffset(bytes)[0], 0, bytes.size()), 1);
  };
  auto ok = decode(build(2, 0b101, false, false));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->dtype, "BF16");
  EXPECT_EQ(ok->lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  struct Case {
    std::string bytes;
    const char* problem;
  };
  const Case cases[] = {
      {build(200, 0, false, false), "dtype code"},
      {build(0, 1u << 20, false, false), "target-module bits"},
      {build(1, 0, true, false), "dtype stored both ways"},
      {build(0, 1, false, true), "target modules stored both ways"},
  };
  for (const Case& c : cases) {
    auto r = decode(c.bytes);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << c.problem << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.problem), std::string::npos) << r.status();
  }
}

// Layout 4 leaves a revision's base out only when it is its policy's; any other base, the empty
// one included, is stored and reads back as written, whatever the policy's base is.
TEST(CatalogCodecTest, Layout4LeavesOutOnlyThePolicysBase) {
  RevisionRecord rev;
  rev.id = 5;
  rev.policy_id = 2;
  rev.seq = 1;
  rev.lora.r = 16;
  rev.dtype = "BF16";
  auto policy_base = [](uint64_t) -> absl::StatusOr<std::string> { return "qwen3-4b"; };
  size_t own_size = 0;
  for (const std::string base : {"qwen3-4b", "qwen3-30b", ""}) {
    rev.base = base;
    const std::string bytes = EncodeRevision(rev, "qwen3-4b");
    if (base == "qwen3-4b") own_size = bytes.size();
    auto r = DecodeRevision(At(AtEveryOffset(bytes)[0], 0, bytes.size()), 5, policy_base);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->base, base);
    // A record whose base is not the policy's reads without the policy.
    auto plain = DecodeRevision(At(AtEveryOffset(bytes)[0], 0, bytes.size()), 5);
    EXPECT_EQ(plain.ok(), base != "qwen3-4b") << base;
    if (plain.ok()) {
      EXPECT_EQ(plain->base, base);
    }
    if (base == "qwen3-30b") {
      EXPECT_GE(bytes.size(), own_size + 12);
    }
  }
  // Layout 3 stores no empty base: an absent base reads as empty there, never as the policy's.
  rev.base = "";
  const std::string v3 = EncodeRevisionLayout3(rev);
  auto r3 = DecodeRevision(At(AtEveryOffset(v3)[0], 0, v3.size()), 5, policy_base);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(r3->base, "");
}

// v7 policy records leave the id to the key; v1-v6 records store it. Both read the key's id.
TEST(CatalogCodecTest, PolicyRecordsTakeTheirIdFromTheKey) {
  PolicyRecord p;
  p.id = 77;
  p.name = "acme/support";
  p.base = "qwen3-4b";
  p.created_us = 1700000000000000;
  const std::string v7 = EncodePolicy(p);
  const std::string v6 = EncodePolicyWithId(p);
  EXPECT_EQ(v7.size() + 8, v6.size());
  EXPECT_EQ(v7.size() % 8, 0u);  // views read it in place under an 8-byte key
  for (const std::string* bytes : {&v7, &v6}) {
    auto d = DecodePolicy(At(AtEveryOffset(*bytes)[0], 0, bytes->size()), 77);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->id, 77u);
    EXPECT_EQ(d->name, "acme/support");
    EXPECT_EQ(d->base, "qwen3-4b");
    EXPECT_EQ(d->created_us, p.created_us);
  }
}

// Schema v5 stores the catalog's own alias-move reasons as one byte and any other reason as its
// string; entries of older stores (always a string) read the same.
TEST(CatalogCodecTest, AliasLogReasonsReadTheSameInBothForms) {
  for (const char* reason : {"publish", "set", "rollback", "promote", "", "Publish"}) {
    AliasLogEntry e;
    e.time_us = 1700000000000003;
    e.from_revision = 4;
    e.to_revision = 5;
    e.reason = reason;
    const std::string v5 = EncodeAliasLogEntry(e);
    const std::string old = EncodeAliasLogEntryLayout1(e);
    const bool own = e.reason == "publish" || e.reason == "set" || e.reason == "rollback";
    if (own) {
      EXPECT_LT(v5.size(), old.size()) << reason;  // no string, no offset
    } else {
      EXPECT_EQ(v5, old) << reason;
    }
    for (const std::string* bytes : {&v5, &old}) {
      auto d = DecodeAliasLogEntry(At(AtEveryOffset(*bytes)[3], 3, bytes->size()));
      ASSERT_TRUE(d.ok()) << reason << ": " << d.status();
      EXPECT_EQ(d->reason, reason);
      EXPECT_EQ(d->time_us, e.time_us);
      EXPECT_EQ(d->from_revision, 4u);
      EXPECT_EQ(d->to_revision, 5u);
    }
  }
}

}  // namespace
}  // namespace loradb::catalog_codec
