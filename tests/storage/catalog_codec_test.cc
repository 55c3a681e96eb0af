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
    auto r = DecodeRevision(At(revs[off], off, rev_bytes.size()));
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
  auto bad = DecodeRevision(At(revs[3], 3, rev_bytes.size() / 2));
  EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
}

}  // namespace
}  // namespace loradb::catalog_codec
