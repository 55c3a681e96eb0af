#include "storage/util/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>

#include "storage/util/hash.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

TEST(FileUtilTest, AtomicWriteThenRead) {
  testing::TempDir dir;
  std::string path = dir.file("a.bin");
  ASSERT_TRUE(WriteFileAtomic(path, "hello").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "world!").ok());
  auto data = ReadFileToString(path);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, "world!");
  // No temp files left behind.
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++n;
  }
  EXPECT_EQ(n, 1);
}

TEST(FileUtilTest, MissingFileIsNotFound) {
  testing::TempDir dir;
  auto data = ReadFileToString(dir.file("nope"));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  auto m = MappedFile::Open(dir.file("nope"));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
}

TEST(FileUtilTest, WriteIntoMissingDirectoryFailsCleanly) {
  testing::TempDir dir;
  absl::Status st = WriteFileAtomic(dir.file("no/such/dir/x"), "data");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
}

// I/O errors are not loradb bugs: EIO maps to Unknown (the C API's LORADB_IO_ERROR), never to
// Internal; a bad descriptor or address (our bug) does.
TEST(FileUtilTest, ErrnoCodes) {
  EXPECT_TRUE(absl::IsUnknown(ErrnoToStatus(EIO, "read x")));
  EXPECT_TRUE(absl::IsUnknown(ErrnoToStatus(ENXIO, "read x")));
  EXPECT_TRUE(absl::IsNotFound(ErrnoToStatus(ENOENT, "open x")));
  EXPECT_TRUE(absl::IsResourceExhausted(ErrnoToStatus(ENOSPC, "write x")));
  EXPECT_TRUE(absl::IsResourceExhausted(ErrnoToStatus(ENOMEM, "mmap x")));
  EXPECT_TRUE(absl::IsPermissionDenied(ErrnoToStatus(EACCES, "open x")));
  EXPECT_TRUE(absl::IsInternal(ErrnoToStatus(EBADF, "read x")));
  EXPECT_EQ(ErrnoToStatus(EIO, "read x").message(), "read x: Input/output error");
}

TEST(FileUtilTest, MapFile) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.file("m"), "abcdef").ok());
  auto m = MappedFile::Open(dir.file("m"));
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 6u);
  EXPECT_EQ(static_cast<char>(m->data()[3]), 'd');
  MappedFile moved = std::move(*m);
  EXPECT_EQ(moved.size(), 6u);
  EXPECT_EQ(m->size(), 0u);
}

TEST(HashTest, Hash128HexRoundTrip) {
  Hash128 h = Xxh3_128("abc", 3);
  auto parsed = ParseHash128(h.Hex());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, h);
  EXPECT_FALSE(ParseHash128("xyz").ok());
  Xxh3_128Stream s;
  s.Update("a", 1);
  s.Update("bc", 2);
  EXPECT_EQ(s.Digest(), h);
  EXPECT_NE(Xxh3_64("abc", 3), Xxh3_64("abd", 3));
}

}  // namespace
}  // namespace loradb
