#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "storage/tiers/loader.h"
#include "storage/util/file_util.h"
#include "storage/util/hash.h"
#include "tests/test_util.h"

namespace loradb::tiers {
namespace {

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

class LoaderTest : public ::testing::TestWithParam<LoaderBackend> {
 protected:
  std::unique_ptr<Loader> MakeLoader(LoaderOptions options = {}) {
    options.backend = GetParam();
    options.chunk_bytes = 64 << 10;  // many chunks per file
    options.queue_depth = 8;
    auto loader = Loader::Create(options);
    if (!loader.ok()) return nullptr;
    return std::move(*loader);
  }
};

TEST_P(LoaderTest, ReadsFilesOfAwkwardSizesExactly) {
  auto loader = MakeLoader();
  if (loader == nullptr) GTEST_SKIP() << "io_uring is not available on this kernel";
  EXPECT_EQ(loader->stats().backend, GetParam());
  loradb::testing::TempDir dir;
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{65537}, size_t{(3 << 20) + 123}}) {
    std::string data = RandomBytes(n, static_cast<uint32_t>(n));
    std::string path = dir.file("f" + std::to_string(n));
    ASSERT_TRUE(WriteFileAtomic(path, data).ok());
    auto buf = loader->ReadFile(path, Xxh3_128(data.data(), data.size()));
    ASSERT_TRUE(buf.ok()) << buf.status();
    ASSERT_EQ((*buf)->size(), n);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>((*buf)->data()), n), data) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*buf)->data()) % kHostAlignment, 0u);
  }
  LoaderStats s = loader->stats();
  EXPECT_EQ(s.files, 6u);
  EXPECT_EQ(s.o_direct_files + s.buffered_files, 6u);
  EXPECT_GT(s.chunks, 6u);
}

// Buffered reads of files in the page cache (the warm path): io_uring hands a file of several
// chunks to its workers (IOSQE_ASYNC), which complete them in any order on any core.
TEST_P(LoaderTest, BufferedReadsOfSeveralChunksReadExactly) {
  LoaderOptions o;
  o.o_direct = false;
  auto loader = MakeLoader(o);
  if (loader == nullptr) GTEST_SKIP() << "io_uring is not available on this kernel";
  loradb::testing::TempDir dir;
  const size_t sizes[] = {1, 65536, 65537, (1 << 20) + 4097, (5 << 20) + 3};
  for (size_t n : sizes) {
    std::string data = RandomBytes(n, static_cast<uint32_t>(n) + 1);
    std::string path = dir.file("b" + std::to_string(n));
    ASSERT_TRUE(WriteFileAtomic(path, data).ok());
    for (int rep = 0; rep < 3; ++rep) {
      auto buf = loader->ReadFile(path, Xxh3_128(data.data(), data.size()));
      ASSERT_TRUE(buf.ok()) << buf.status();
      ASSERT_EQ((*buf)->size(), n);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>((*buf)->data()), n), data) << n;
    }
  }
  LoaderStats s = loader->stats();
  EXPECT_EQ(s.files, 15u);
  EXPECT_EQ(s.buffered_files, 15u);
  EXPECT_EQ(s.o_direct_files, 0u);
}

TEST_P(LoaderTest, ContentHashMismatchIsDataLoss) {
  auto loader = MakeLoader();
  if (loader == nullptr) GTEST_SKIP() << "io_uring is not available on this kernel";
  loradb::testing::TempDir dir;
  std::string data = RandomBytes(100000, 7);
  std::string path = dir.file("blob");
  Hash128 good = Xxh3_128(data.data(), data.size());
  data[5000] ^= 1;  // the file on disk is corrupt
  ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  auto buf = loader->ReadFile(path, good);
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(buf.status().message().find(good.Hex()), absl::string_view::npos);
  EXPECT_EQ(loader->stats().checksum_failures, 1u);
  EXPECT_EQ(loader->stats().files, 0u);
}

TEST_P(LoaderTest, MissingFileAndDirectoryAreErrors) {
  auto loader = MakeLoader();
  if (loader == nullptr) GTEST_SKIP() << "io_uring is not available on this kernel";
  loradb::testing::TempDir dir;
  auto missing = loader->ReadFile(dir.file("nope"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto is_dir = loader->ReadFile(dir.path());
  EXPECT_EQ(is_dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(loader->stats().read_errors, 2u);
}

TEST_P(LoaderTest, LoadTensorsRunsTheParserOverTheBuffer) {
  auto loader = MakeLoader();
  if (loader == nullptr) GTEST_SKIP() << "io_uring is not available on this kernel";
  loradb::testing::TempDir dir;
  std::string data = RandomBytes(8192, 3);
  std::string path = dir.file("t");
  ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  ParseFn one_tensor = [](std::span<const std::byte> bytes,
                          std::shared_ptr<const void> backing) -> absl::StatusOr<TensorSet> {
    TensorSet set(std::move(backing));
    TensorView v;
    v.name = "all";
    v.dtype = DType::kU8;
    v.shape = {static_cast<int64_t>(bytes.size())};
    v.data = bytes.data();
    v.nbytes = bytes.size();
    if (auto st = set.Add(v); !st.ok()) return st;
    return set;
  };
  auto set = loader->LoadTensors(path, one_tensor);
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->size(), 1u);
  EXPECT_EQ(std::memcmp(set->tensors()[0].data, data.data(), data.size()), 0);

  ParseFn corrupt = [](std::span<const std::byte>,
                       std::shared_ptr<const void>) -> absl::StatusOr<TensorSet> {
    return absl::DataLossError("tensor x: xxh3-64 mismatch");
  };
  auto bad = loader->LoadTensors(path, corrupt);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(loader->stats().checksum_failures, 1u);
}

INSTANTIATE_TEST_SUITE_P(Backends, LoaderTest,
                         ::testing::Values(LoaderBackend::kIoUring, LoaderBackend::kPread),
                         [](const auto& info) {
                           return std::string(LoaderBackendName(info.param));
                         });

// READ_FIXED into a registered destination buffer reads the same bytes as plain reads; a
// refused registration (RLIMIT_MEMLOCK) is counted and the file is still read correctly.
TEST(LoaderRegisteredBuffersTest, ReadFixedReadsTheSameBytes) {
  LoaderOptions o;
  o.backend = LoaderBackend::kIoUring;
  o.registered_buffers = true;
  o.chunk_bytes = 64 << 10;
  o.queue_depth = 8;
  auto loader = Loader::Create(o);
  if (!loader.ok()) GTEST_SKIP() << "io_uring is not available: " << loader.status();
  loradb::testing::TempDir dir;
  for (size_t n : {size_t{1}, size_t{4096}, size_t{(1 << 20) + 777}}) {
    std::string data = RandomBytes(n, static_cast<uint32_t>(n) + 1);
    std::string path = dir.file("r" + std::to_string(n));
    ASSERT_TRUE(WriteFileAtomic(path, data).ok());
    auto buf = (*loader)->ReadFile(path, Xxh3_128(data.data(), data.size()));
    ASSERT_TRUE(buf.ok()) << buf.status();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>((*buf)->data()), n), data) << n;
  }
  LoaderStats s = (*loader)->stats();
  EXPECT_EQ(s.files, 3u);
  EXPECT_EQ(s.fixed_buffer_files + s.fixed_buffer_failures, 3u);
  // Sequential reads share one ring: it is unregistered and reused after each file.
  EXPECT_EQ(s.rings, 1u);
}

TEST(LoaderFallbackTest, EnvironmentForcesThePreadPool) {
  ::setenv("LORADB_LOADER", "pread", 1);
  auto loader = Loader::Create();
  ::unsetenv("LORADB_LOADER");
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ((*loader)->stats().backend, LoaderBackend::kPread);
  loradb::testing::TempDir dir;
  std::string data = RandomBytes(5 << 20, 11);
  ASSERT_TRUE(WriteFileAtomic(dir.file("x"), data).ok());
  auto buf = (*loader)->ReadFile(dir.file("x"));
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ(std::memcmp((*buf)->data(), data.data(), data.size()), 0);
}

TEST(LoaderFallbackTest, BadOptionsAreRejected) {
  LoaderOptions o;
  o.chunk_bytes = 1000;
  EXPECT_EQ(Loader::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.queue_depth = 0;
  EXPECT_EQ(Loader::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loradb::tiers
