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
  const std::string rev_bytes = EncodeRevision(rev);
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

// Layout 2 (written since schema v4) and layout 1 (read from older stores) hold the same record;
// layout 2 leaves the id to the key and is smaller.
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
  const std::string v2 = EncodeRevision(rev);
  EXPECT_LT(v2.size(), v1.size());
  auto a = DecodeRevision(At(AtEveryOffset(v1)[0], 0, v1.size()), 99);
  auto b = DecodeRevision(At(AtEveryOffset(v2)[0], 0, v2.size()), 7);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (const RevisionRecord* r : {&*a, &*b}) {
    EXPECT_EQ(r->id, 7u);  // layout 1: the stored id; layout 2: the key
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
