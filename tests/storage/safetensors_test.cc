#include "storage/formats/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "storage/util/file_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::testing::HasSubstr;

const char kJl[] = "safetensors/safetensors_jl/";

// A safetensors buffer with `header` (verbatim) and `data`.
std::string MakeFile(const std::string& header, const std::string& data) {
  std::string out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

absl::StatusOr<TensorSet> ParseString(const std::string& s) {
  auto holder = std::make_shared<std::string>(s);
  return safetensors::Parse(std::span<const std::byte>(
                                reinterpret_cast<const std::byte*>(holder->data()), holder->size()),
                            holder);
}

// Expects `bytes` to be rejected as InvalidArgument with `needle` in the message.
void ExpectRejected(const std::string& bytes, const std::string& needle) {
  auto set = ParseString(bytes);
  ASSERT_FALSE(set.ok()) << "accepted: " << needle;
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument) << set.status();
  EXPECT_THAT(std::string(set.status().message()), HasSubstr(needle));
}

float HalfToFloat(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                     : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

// Element `i` of `t` as a double (numeric dtypes used by the third-party test data).
double ElementAsDouble(const TensorView& t, size_t i) {
  const std::byte* p = t.data + i * DTypeSize(t.dtype);
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return static_cast<double>(v);
  };
  switch (t.dtype) {
    case DType::kBool:
    case DType::kU8:
      return load(uint8_t{});
    case DType::kI8:
      return load(int8_t{});
    case DType::kI16:
      return load(int16_t{});
    case DType::kI32:
      return load(int32_t{});
    case DType::kI64:
      return load(int64_t{});
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    }
    case DType::kF32:
      return load(float{});
    case DType::kF64:
      return load(double{});
    default:
      ADD_FAILURE() << "unexpected dtype " << DTypeName(t.dtype);
      return 0;
  }
}

TEST(SafetensorsTest, NumpyFileHoldsArangeValues) {
  auto set = safetensors::ReadFile(
      testing::TestData(std::string(kJl) + "non_sharded/model.numpy.safetensors"));
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->size(), 27u);
  const std::pair<const char*, DType> kinds[] = {
      {"float16", DType::kF16}, {"float32", DType::kF32}, {"float64", DType::kF64},
      {"bool", DType::kBool},   {"uint8", DType::kU8},    {"int8", DType::kI8},
      {"int16", DType::kI16},   {"int32", DType::kI32},   {"int64", DType::kI64}};
  const std::pair<const char*, std::vector<int64_t>> shapes[] = {
      {"3", {3}}, {"35", {3, 5}}, {"357", {3, 5, 7}}};
  for (const auto& [prefix, dtype] : kinds) {
    for (const auto& [suffix, shape] : shapes) {
      std::string name = std::string(prefix) + "_" + suffix;
      const TensorView* t = set->Find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->dtype, dtype) << name;
      EXPECT_EQ(t->shape, shape) << name;
      ASSERT_EQ(t->nbytes, t->numel() * DTypeSize(dtype)) << name;
      for (size_t i = 0; i < t->numel(); ++i) {
        double want =
            dtype == DType::kBool ? static_cast<double>(i % 2 == 1) : static_cast<double>(i);
        ASSERT_EQ(ElementAsDouble(*t, i), want) << name << " element " << i;
      }
    }
  }
  EXPECT_TRUE(set->metadata().empty());
}

TEST(SafetensorsTest, TorchFileHasAllDtypes) {
  auto set =
      safetensors::ReadFile(testing::TestData(std::string(kJl) + "non_sharded/model.safetensors"));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->size(), 36u);
  const TensorView* bf = set->Find("bfloat16_357");
  ASSERT_NE(bf, nullptr);
  EXPECT_EQ(bf->dtype, DType::kBF16);
  EXPECT_EQ(bf->shape, (std::vector<int64_t>{3, 5, 7}));
  ASSERT_NE(set->Find("float8_e4m3fn_35"), nullptr);
  EXPECT_EQ(set->Find("float8_e4m3fn_35")->dtype, DType::kF8E4M3);
  ASSERT_NE(set->Find("float8_e5m2_3"), nullptr);
  EXPECT_EQ(set->Find("float8_e5m2_3")->dtype, DType::kF8E5M2);
}

TEST(SafetensorsTest, MetadataIsRead) {
  auto set = safetensors::ReadFile(
      testing::TestData(std::string(kJl) + "non_sharded/model.with_metadata.safetensors"));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->metadata(),
            (std::map<std::string, std::string>{{"test", "metadata"}, {"version", "2.2"}}));
}

TEST(SafetensorsTest, ShardedMatchesNonSharded) {
  auto sharded = safetensors::ReadSharded(
      testing::TestData(std::string(kJl) + "sharded/model.safetensors.index.json"));
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  auto whole =
      safetensors::ReadFile(testing::TestData(std::string(kJl) + "non_sharded/model.safetensors"));
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(sharded->size(), whole->size());
  for (const TensorView& t : whole->tensors()) {
    const TensorView* s = sharded->Find(t.name);
    ASSERT_NE(s, nullptr) << t.name;
    EXPECT_EQ(s->dtype, t.dtype);
    EXPECT_EQ(s->shape, t.shape);
    ASSERT_EQ(s->nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(s->data, t.data, t.nbytes), 0) << t.name;
  }
  EXPECT_EQ(sharded->metadata().at("total_size"), "4305");
}

TEST(SafetensorsTest, ShardedRejectsInconsistentIndex) {
  testing::TempDir dir;
  std::string shard = MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "xy");
  ASSERT_TRUE(WriteFileAtomic(dir.file("s1.safetensors"), shard).ok());
  auto write_index = [&](const std::string& json) {
    ASSERT_TRUE(WriteFileAtomic(dir.file("index.json"), json).ok());
  };
  write_index(R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})");
  auto r = safetensors::ReadSharded(dir.file("index.json"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("\"b\" is not in shard"));

  ASSERT_TRUE(WriteFileAtomic(dir.file("s2.safetensors"),
                              MakeFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                       R"("c":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                       "zw"))
                  .ok());
  write_index(R"({"weight_map":{"a":"s2.safetensors"}})");
  r = safetensors::ReadSharded(dir.file("index.json"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("weight_map lists 1"));

  write_index(R"({"weight_map":{"a":"../s1.safetensors"}})");
  r = safetensors::ReadSharded(dir.file("index.json"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("plain file name"));

  write_index(R"({"weight_map":{"a":"missing.safetensors"}})");
  EXPECT_EQ(safetensors::ReadSharded(dir.file("index.json")).status().code(),
            absl::StatusCode::kNotFound);

  write_index(R"({"metadata":{}})");
  r = safetensors::ReadSharded(dir.file("index.json"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("weight_map"));

  write_index("{not json");
  EXPECT_FALSE(safetensors::ReadSharded(dir.file("index.json")).ok());
}

TEST(SafetensorsTest, CppFile) {
  auto set =
      safetensors::ReadFile(testing::TestData("safetensors/safetensors_cpp/model.safetensors"));
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->size(), 2u);
  EXPECT_EQ(set->Find("weight1")->shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(set->Find("weight1")->dtype, DType::kF64);
  EXPECT_EQ(set->Find("weight2")->shape, (std::vector<int64_t>{16, 16}));
}

TEST(SafetensorsTest, AbuseFileRejected) {
  std::string path = testing::TestData("safetensors/safetensors_cpp/abuse_attempt_1.safetensors");
  auto set = safetensors::ReadFile(path);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(set.status().message()), HasSubstr("runs past the end of the file"));
  EXPECT_THAT(std::string(set.status().message()), HasSubstr(path));
}

// Files written by the reference implementation re-serialize to the same bytes.
TEST(SafetensorsTest, ReferenceFilesRewriteIdentically) {
  for (const std::string& rel : {std::string(kJl) + "non_sharded/model.numpy.safetensors",
                                 std::string(kJl) + "non_sharded/model.safetensors",
                                 std::string(kJl) + "non_sharded/model.with_metadata.safetensors",
                                 std::string(kJl) + "sharded/model-00001-of-00006.safetensors",
                                 std::string(kJl) + "sharded/model-00004-of-00006.safetensors",
                                 std::string("safetensors/safetensors_cpp/model.safetensors")}) {
    std::string path = testing::TestData(rel);
    auto original = ReadFileToString(path);
    ASSERT_TRUE(original.ok()) << original.status();
    auto set = safetensors::ReadFile(path);
    ASSERT_TRUE(set.ok()) << set.status();
    auto bytes = safetensors::Serialize(set->tensors(), set->metadata());
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_TRUE(*bytes == *original) << rel;
  }
}

TEST(SafetensorsTest, WriterRoundTripAndLayout) {
  std::vector<float> f = {1.5f, -2.0f, 3.25f};
  std::vector<uint8_t> u = {7, 8};
  std::vector<int64_t> i64 = {-1};
  std::vector<TensorView> views = {
      {"zeta", DType::kF32, {3}, reinterpret_cast<const std::byte*>(f.data()), 12},
      {"alpha", DType::kU8, {2, 1}, reinterpret_cast<const std::byte*>(u.data()), 2},
      {"mid\"q\n", DType::kI64, {}, reinterpret_cast<const std::byte*>(i64.data()), 8},
      {"empty", DType::kF16, {0, 4}, nullptr, 0},
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "é\t"}};
  auto bytes = safetensors::Serialize(views, meta);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ((*bytes)[8], '{');
  std::string header = bytes->substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  // Sorted by dtype (I64 > F32 > F16 > U8), then name.
  EXPECT_LT(header.find("mid"), header.find("zeta"));
  EXPECT_LT(header.find("zeta"), header.find("empty"));
  EXPECT_LT(header.find("empty"), header.find("alpha"));
  EXPECT_THAT(header, HasSubstr(R"("mid\"q\n")"));
  EXPECT_THAT(header, HasSubstr(R"("note":"é\t")"));

  testing::TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.file("x.safetensors"), views, meta).ok());
  auto set = safetensors::ReadFile(dir.file("x.safetensors"));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->metadata(), meta);
  ASSERT_EQ(set->size(), views.size());
  for (const TensorView& v : views) {
    const TensorView* got = set->Find(v.name);
    ASSERT_NE(got, nullptr) << v.name;
    EXPECT_EQ(got->dtype, v.dtype);
    EXPECT_EQ(got->shape, v.shape);
    ASSERT_EQ(got->nbytes, v.nbytes);
    if (v.nbytes > 0) {
      EXPECT_EQ(std::memcmp(got->data, v.data, v.nbytes), 0);
    }
  }
}

TEST(SafetensorsTest, WriterRejectsBadViews) {
  std::vector<float> f = {1, 2, 3};
  auto p = reinterpret_cast<const std::byte*>(f.data());
  auto err = [](std::vector<TensorView> v) {
    auto r = safetensors::Serialize(v, {});
    EXPECT_FALSE(r.ok());
    return std::string(r.status().message());
  };
  EXPECT_THAT(err({{"a", DType::kF32, {2}, p, 12}}), HasSubstr("needs 8"));
  EXPECT_THAT(err({{"a", DType::kF32, {3}, p, 12}, {"a", DType::kF32, {3}, p, 12}}),
              HasSubstr("duplicate tensor name"));
  EXPECT_THAT(err({{"__metadata__", DType::kF32, {3}, p, 12}}), HasSubstr("reserved"));
  EXPECT_THAT(err({{"a", DType::kF32, {-1}, p, 12}}), HasSubstr("negative dimension"));
  EXPECT_THAT(err({{"a", DType::kF32, {3}, nullptr, 12}}), HasSubstr("null data"));

  // A failed write leaves the destination as it was.
  testing::TempDir dir;
  std::string path = dir.file("keep.safetensors");
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  EXPECT_FALSE(safetensors::WriteFile(path, {{"a", DType::kF32, {2}, p, 12}}, {}).ok());
  EXPECT_EQ(*ReadFileToString(path), "old");
  EXPECT_FALSE(safetensors::WriteFile(dir.file("no/such/dir/x"), {}, {}).ok());
}

const char kOneTensor[] = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";

TEST(SafetensorsRejectTest, ShorterThanLengthPrefix) {
  ExpectRejected("", "shorter than the 8-byte header length");
  ExpectRejected("1234567", "shorter than the 8-byte header length");
}

TEST(SafetensorsRejectTest, HeaderLengthTooLarge) {
  std::string f = MakeFile("{}", "");
  uint64_t n = 100'000'001;
  std::memcpy(f.data(), &n, 8);
  ExpectRejected(f, "exceeds the limit of 100000000");
}

TEST(SafetensorsRejectTest, HeaderLengthPastEnd) {
  std::string f = MakeFile("{}", "");
  f[0] = 3;
  ExpectRejected(f, "runs past the end of the file");
}

TEST(SafetensorsRejectTest, HeaderNotUtf8) {
  ExpectRejected(
      MakeFile("{\"\xff\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", "ab"),
      "not valid UTF-8");
}

TEST(SafetensorsRejectTest, HeaderNotJson) {
  ExpectRejected(MakeFile("", ""), "not valid JSON");
  ExpectRejected(MakeFile("{\"a\":", ""), "not valid JSON");
  ExpectRejected(MakeFile(std::string(kOneTensor) + std::string(1, '\0'), "ab"), "not valid JSON");
  ExpectRejected(MakeFile("[]", ""), "must be a JSON object");
}

TEST(SafetensorsRejectTest, HeaderNotTheExpectedJson) {
  ExpectRejected(MakeFile(R"({"a":[1]})", ""), "expected an object");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","data_offsets":[0,2]}})", "ab"),
                 "missing field \"shape\"");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"u8","shape":[2],"data_offsets":[0,2]}})", "ab"),
                 "unknown dtype \"u8\"");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", "ab"),
                 "shape dimension must be a non-negative integer");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", "ab"),
                 "shape dimension must be a non-negative integer");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,3]}})", "ab"),
                 "array of two integers");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,-2]}})", "ab"),
                 "data_offsets[1] must be a non-negative integer");
  ExpectRejected(
      MakeFile(R"({"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "ab"),
      "duplicate field \"dtype\"");
  ExpectRejected(MakeFile(R"({"__metadata__":{"k":1},"a":{"dtype":"U8","shape":[2],)"
                          R"("data_offsets":[0,2]}})",
                          "ab"),
                 "__metadata__ value of \"k\" must be a string");
  ExpectRejected(MakeFile(R"({"__metadata__":[]})", ""), "__metadata__ must be an object");
}

// Found by the Python differential oracle: simdjson reads "-0" as 0, the reference rejects it.
TEST(SafetensorsRejectTest, NegativeZeroDimensionRegression) {
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}})", ""),
                 "shape must hold non-negative integers, got 0");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[-0,0]}})", ""),
                 "data_offsets must hold non-negative integers");
  // "-0" inside a name is fine.
  EXPECT_TRUE(
      ParseString(MakeFile(R"({"l-0":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", "")).ok());
}

TEST(SafetensorsRejectTest, OffsetsWithGap) {
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", "xab"),
                 "not contiguous (expected to start at 0)");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                          R"("b":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}})",
                          "abxc"),
                 "tensor \"b\": data_offsets [3, 4] are not contiguous");
}

TEST(SafetensorsRejectTest, OffsetsOverlap) {
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                          R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                          "abc"),
                 "not contiguous (expected to start at 2)");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,0]}})", "ab"),
                 "not contiguous");
}

TEST(SafetensorsRejectTest, ByteLengthNotShapeTimesDtype) {
  ExpectRejected(MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd"),
                 "data_offsets span 4 bytes but F32 [2] needs 8");
}

TEST(SafetensorsRejectTest, ShapeOverflow) {
  ExpectRejected(MakeFile(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                          R"("data_offsets":[0,4]}})",
                          "abcd"),
                 "overflows");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[9223372036854775808],)"
                          R"("data_offsets":[0,4]}})",
                          "abcd"),
                 "overflows");
}

TEST(SafetensorsRejectTest, DataNotCoveredExactly) {
  ExpectRejected(MakeFile(kOneTensor, "abc"), "data section is 3 bytes but tensors cover 2");
  ExpectRejected(MakeFile(kOneTensor, "a"), "past the data section");
  ExpectRejected(MakeFile("{}", "x"), "data section is 1 bytes but tensors cover 0");
}

TEST(SafetensorsRejectTest, DuplicateNames) {
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                          R"("a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                          "abcd"),
                 "duplicate tensor name \"a\"");
  ExpectRejected(MakeFile(R"({"__metadata__":{},"__metadata__":{}})", ""),
                 "duplicate __metadata__");
}

TEST(SafetensorsAcceptTest, WhitespaceAroundHeader) {
  auto set = ParseString(MakeFile(std::string("  \n") + kOneTensor + " \t\n ", "ab"));
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_NE(set->Find("a"), nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(set->Find("a")->data), 2), "ab");
}

TEST(SafetensorsAcceptTest, OutOfOrderEntriesUnknownFieldsNullMetadataEmpty) {
  auto set = ParseString(MakeFile(R"({"__metadata__":null,)"
                                  R"("b":{"dtype":"U8","shape":[1],"data_offsets":[2,3],"x":1},)"
                                  R"("z":{"dtype":"F32","shape":[0,3],"data_offsets":[2,2]},)"
                                  R"("a":{"dtype":"U16","shape":[],"data_offsets":[0,2]}})",
                                  "abc"));
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->size(), 3u);
  EXPECT_EQ(set->tensors()[0].name, "a");  // listed in offset order
  EXPECT_EQ(*reinterpret_cast<const char*>(set->Find("b")->data), 'c');
  EXPECT_EQ(set->Find("z")->nbytes, 0u);
  EXPECT_TRUE(ParseString(MakeFile("{}", "")).ok());
}

// Parse indexes every name once while reading the header: a duplicate name is reported as such
// even when its offsets are also wrong, and the first error in header order wins.
TEST(SafetensorsRejectTest, DuplicateNameBeforeOffsetErrors) {
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                          R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                          "ab"),
                 "duplicate tensor name \"a\"");
  ExpectRejected(MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                          R"("b":{"dtype":"U8","shape":[2]},)"
                          R"("a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                          "abcd"),
                 "tensor \"b\": missing field \"data_offsets\"");
}

// A large header (many entries, out of offset order) parses into offset order with every name
// findable and every view on its own bytes.
TEST(SafetensorsAcceptTest, ManyEntriesOutOfOrder) {
  const int n = 3000;
  std::string header = "{";
  std::string data;
  for (int i = 0; i < n; ++i) data.push_back(static_cast<char>(i % 251));
  for (int k = 0; k < n; ++k) {
    int i = (k * 7) % n;  // a permutation of 0..n-1 (7 and 3000 are coprime)
    if (k > 0) header += ",";
    header += "\"layers." + std::to_string(i) +
              ".lora_A.weight\":{\"dtype\":\"U8\",\"shape\":[1],"
              "\"data_offsets\":[" +
              std::to_string(i) + "," + std::to_string(i + 1) + "]}";
  }
  header += "}";
  auto set = ParseString(MakeFile(header, data));
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    std::string name = "layers." + std::to_string(i) + ".lora_A.weight";
    EXPECT_EQ(set->tensors()[static_cast<size_t>(i)].name, name);
    const TensorView* v = set->Find(name);
    ASSERT_NE(v, nullptr) << name;
    EXPECT_EQ(static_cast<unsigned char>(*reinterpret_cast<const char*>(v->data)), i % 251);
  }
}

// The reference accepts an empty tensor name; so do the reader and the writer.
TEST(SafetensorsAcceptTest, EmptyNameRoundTrips) {
  auto set = ParseString(MakeFile(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "z"));
  ASSERT_TRUE(set.ok()) << set.status();
  auto bytes = safetensors::Serialize(set->tensors(), {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(ParseString(*bytes).ok());
}

}  // namespace
}  // namespace loradb
