// Runs the built `loradb inspect` on every third-party test file (tests/testdata) and on files the
// test writes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/test_paths.h"
#include "storage/formats/blob.h"
#include "storage/formats/peft.h"
#include "storage/formats/safetensors.h"
#include "storage/util/file_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

RunResult RunCli(const std::string& args) {
  testing::TempDir tmp;
  std::string cmd =
      std::string(LORADB_CLI_PATH) + " " + args + " >" + tmp.file("out") + " 2>" + tmp.file("err");
  int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFileToString(tmp.file("out")).value_or("");
  r.err = ReadFileToString(tmp.file("err")).value_or("");
  return r;
}

nlohmann::json InspectJson(const std::string& path) {
  RunResult r = RunCli("inspect --json " + ShellQuote(path));
  EXPECT_EQ(r.exit_code, 0) << path << ": " << r.err;
  EXPECT_EQ(r.err, "");
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

void ExpectOneErrorLine(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, StartsWith("error: "));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr(needle));
  EXPECT_EQ(r.out, "");
}

TEST(InspectTest, EverySharedSafetensorsFile) {
  struct Want {
    const char* rel;
    size_t tensors;
  };
  const Want files[] = {
      {"safetensors/safetensors_jl/non_sharded/model.numpy.safetensors", 27},
      {"safetensors/safetensors_jl/non_sharded/model.safetensors", 36},
      {"safetensors/safetensors_jl/non_sharded/model.with_metadata.safetensors", 36},
      {"safetensors/safetensors_cpp/model.safetensors", 2},
  };
  for (const Want& w : files) {
    nlohmann::json j = InspectJson(testing::TestData(w.rel));
    EXPECT_EQ(j["format"], "safetensors") << w.rel;
    ASSERT_TRUE(j["tensors"].is_array());
    EXPECT_EQ(j["tensors"].size(), w.tensors) << w.rel;
    EXPECT_TRUE(j["metadata"].is_object());
    EXPECT_FALSE(j.contains("config"));
  }
  nlohmann::json meta = InspectJson(
      testing::TestData("safetensors/safetensors_jl/non_sharded/model.with_metadata.safetensors"));
  EXPECT_EQ(meta["metadata"]["version"], "2.2");
  nlohmann::json cpp =
      InspectJson(testing::TestData("safetensors/safetensors_cpp/model.safetensors"));
  EXPECT_EQ(cpp["tensors"][1],
            (nlohmann::json{
                {"name", "weight2"}, {"dtype", "F64"}, {"shape", {16, 16}}, {"nbytes", 2048}}));

  // Every shard on its own, and the index.
  for (const auto& e : std::filesystem::directory_iterator(
           testing::TestData("safetensors/safetensors_jl/sharded"))) {
    nlohmann::json j = InspectJson(e.path().string());
    bool index = e.path().extension() == ".json";
    EXPECT_EQ(j["format"], index ? "sharded" : "safetensors") << e.path();
    if (index) {
      EXPECT_EQ(j["tensors"].size(), 36u);
    }
  }
}

TEST(InspectTest, TextOutputListsTensors) {
  RunResult r =
      RunCli(ShellQuote(testing::TestData("safetensors/safetensors_cpp/model.safetensors"))
                 .insert(0, "inspect "));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("format:   safetensors"));
  EXPECT_THAT(r.out, HasSubstr("weight2\tF64\t[16, 16]\t2048"));
}

TEST(InspectTest, AbuseFileFailsWithOneErrorLine) {
  ExpectOneErrorLine(
      RunCli("inspect " + ShellQuote(testing::TestData(
                              "safetensors/safetensors_cpp/abuse_attempt_1.safetensors"))),
      "header length 1000 runs past the end of the file");
  ExpectOneErrorLine(
      RunCli("inspect --json " + ShellQuote(testing::TestData(
                                     "safetensors/safetensors_cpp/abuse_attempt_1.safetensors"))),
      "header length 1000");
}

TEST(InspectTest, MalformedInputsFailCleanly) {
  testing::TempDir dir;
  ExpectOneErrorLine(RunCli("inspect " + dir.file("missing")), "No such file");
  ExpectOneErrorLine(RunCli("inspect " + dir.path()), "without adapter_config.json");
  ASSERT_TRUE(WriteFileAtomic(dir.file("short.safetensors"), "abc").ok());
  ExpectOneErrorLine(RunCli("inspect " + dir.file("short.safetensors")), "shorter than");
  ASSERT_TRUE(WriteFileAtomic(dir.file("bad.json"), "{\"weight_map\": 3}").ok());
  ExpectOneErrorLine(RunCli("inspect " + dir.file("bad.json")), "weight_map");
  std::string blob(std::string(kBlobMagic, 8) + std::string(30, '\0'));
  ASSERT_TRUE(WriteFileAtomic(dir.file("bad.blob"), blob).ok());
  ExpectOneErrorLine(RunCli("inspect " + dir.file("bad.blob")), "unsupported blob version 0");
  ExpectOneErrorLine(RunCli("inspect"), "path is required");
}

TEST(InspectTest, PeftDirectoryShowsConfig) {
  testing::TempDir dir;
  std::vector<float> a(2 * 8, 0.5f), b(8 * 2, 0.25f);
  const std::string q = "model.layers.0.self_attn.q_proj";
  std::vector<TensorView> views = {
      {peft::PeftTensorNameFor(q, peft::LoraSide::kA, false),
       DType::kF32,
       {2, 8},
       reinterpret_cast<const std::byte*>(a.data()),
       a.size() * 4},
      {peft::PeftTensorNameFor(q, peft::LoraSide::kB, false),
       DType::kF32,
       {8, 2},
       reinterpret_cast<const std::byte*>(b.data()),
       b.size() * 4},
  };
  peft::LoraConfig config;
  config.r = 2;
  config.lora_alpha = 16;
  config.use_rslora = true;
  config.target_modules = {"q_proj"};
  config.alpha_pattern = {{"k_proj", 4}};
  ASSERT_TRUE(peft::WritePeftDir(dir.file("adapter"), config, views).ok());
  nlohmann::json j = InspectJson(dir.file("adapter"));
  EXPECT_EQ(j["format"], "peft");
  EXPECT_EQ(j["tensors"].size(), 2u);
  EXPECT_EQ(j["config"]["r"], 2);
  EXPECT_EQ(j["config"]["lora_alpha"], 16.0);
  EXPECT_EQ(j["config"]["use_rslora"], true);
  EXPECT_EQ(j["config"]["target_modules"], nlohmann::json::array({"q_proj"}));
  EXPECT_EQ(j["config"]["alpha_pattern"]["k_proj"], 4.0);
  EXPECT_TRUE(j["config"]["rank_pattern"].is_object());

  RunResult text = RunCli("inspect " + dir.file("adapter"));
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_THAT(text.out, HasSubstr("use_rslora: true"));

  ASSERT_TRUE(
      WriteFileAtomic(dir.file("adapter/adapter_config.json"), R"({"r":2,"use_dora":"x"})").ok());
  ExpectOneErrorLine(RunCli("inspect " + dir.file("adapter")), "use_dora");
}

TEST(InspectTest, BlobShowsGroupsAndOriginalNames) {
  testing::TempDir dir;
  std::vector<uint16_t> data(64, 0x3f80);
  std::vector<TensorView> views;
  for (int e = 0; e < 4; ++e) {
    for (const char* side : {"A", "B"}) {
      views.push_back(
          {"base_model.model.model.layers.0.mlp.experts." + std::to_string(e) + ".up_proj.lora_" +
               side + ".weight",
           DType::kBF16,
           std::string(side) == "A" ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{8, 1},
           reinterpret_cast<const std::byte*>(data.data()), 16});
    }
  }
  auto info = WriteBlobFile(dir.file("x.blob"), views, {{"k", "v"}});
  ASSERT_TRUE(info.ok()) << info.status();
  nlohmann::json j = InspectJson(dir.file("x.blob"));
  EXPECT_EQ(j["format"], "blob");
  EXPECT_EQ(j["tensors"].size(), 8u);
  EXPECT_EQ(j["stored_tensors"], 2);
  ASSERT_EQ(j["groups"].size(), 2u);
  EXPECT_EQ(j["groups"][0]["name"],
            "base_model.model.model.layers.0.mlp.experts.up_proj.lora_A.weight");
  EXPECT_EQ(j["groups"][0]["shape"], nlohmann::json::array({4, 1, 8}));
  EXPECT_EQ(j["groups"][0]["members"].size(), 4u);
  EXPECT_EQ(j["metadata"]["k"], "v");
  EXPECT_EQ(j["file_bytes"], info->bytes);

  // A flipped data byte is caught (blobs are verified on inspect).
  std::string bytes = *ReadFileToString(dir.file("x.blob"));
  bytes.back() ^= 1;
  ASSERT_TRUE(WriteFileAtomic(dir.file("bad.blob"), bytes).ok());
  ExpectOneErrorLine(RunCli("inspect " + dir.file("bad.blob")), "checksum mismatch");
}

}  // namespace
}  // namespace loradb
