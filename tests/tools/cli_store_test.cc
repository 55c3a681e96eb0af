// Drives the built `loradb` binary (LORADB_CLI_PATH) through the store commands.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/test_paths.h"
#include "absl/strings/str_cat.h"
#include "storage/formats/model_config.h"
#include "storage/formats/peft.h"
#include "storage/util/file_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::loradb::testing::TempDir;

struct CliRun {
  int rc = -1;
  std::string out, err;
  nlohmann::json json() const { return nlohmann::json::parse(out); }
};

std::string Quote(const std::string& s) {
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

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = dir_.file("store");
    // A tiny Qwen3 config and two PEFT adapters for it, one for a wider model.
    ModelConfig cfg;
    cfg.model_type = "qwen3";
    cfg.vocab_size = 32;
    cfg.hidden_size = 8;
    cfg.intermediate_size = 16;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 2;
    cfg.num_key_value_heads = 1;
    cfg.head_dim = 4;
    cfg.max_position_embeddings = 64;
    ASSERT_TRUE(WriteFileAtomic(dir_.file("config.json"), cfg.ToJson()).ok());
    WriteAdapter("a1", 8, 1.0f);
    WriteAdapter("a2", 8, 2.0f);
    WriteAdapter("wide", 12, 3.0f);
  }

  // q_proj of layer 0 (in = out = hidden) with rank 2.
  void WriteAdapter(const std::string& name, int64_t hidden, float seed) {
    auto a = std::make_unique<std::vector<float>>(2 * hidden);
    auto b = std::make_unique<std::vector<float>>(hidden * 2);
    for (size_t i = 0; i < a->size(); ++i) (*a)[i] = seed + static_cast<float>(i);
    for (size_t i = 0; i < b->size(); ++i) (*b)[i] = seed - static_cast<float>(i);
    std::vector<TensorView> views(2);
    views[0].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    views[0].shape = {2, hidden};
    views[0].data = reinterpret_cast<const std::byte*>(a->data());
    views[0].nbytes = a->size() * 4;
    views[1].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
    views[1].shape = {hidden, 2};
    views[1].data = reinterpret_cast<const std::byte*>(b->data());
    views[1].nbytes = b->size() * 4;
    auto cfg = peft::ParseLoraConfig(
        R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]})");
    ASSERT_TRUE(cfg.ok());
    ASSERT_TRUE(peft::WritePeftDir(dir_.file(name), *cfg, views).ok());
    bufs_.push_back(std::move(a));
    bufs_.push_back(std::move(b));
  }

  CliRun Cli(const std::string& args) {
    CliRun r;
    const std::string out = dir_.file("stdout"), err = dir_.file("stderr");
    const std::string cmd = absl::StrCat(Quote(LORADB_CLI_PATH), " --store ", Quote(store_), " ",
                                         args, " >", Quote(out), " 2>", Quote(err));
    int st = std::system(cmd.c_str());
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = ReadFileToString(out).value_or("");
    r.err = ReadFileToString(err).value_or("");
    return r;
  }

  // Everything a failed command must leave as it was.
  std::string Snapshot() {
    return absl::StrCat(Cli("ls --json --limit 0").out, Cli("policy ls --json").out,
                        Cli("base ls --json").out, Cli("show --json t/p:serving").out,
                        Cli("verify --json").out);
  }

  void ExpectFails(const std::string& args, const std::string& message_part) {
    CliRun r = Cli(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(message_part), std::string::npos) << args << ": " << r.err;
  }

  void InitStore() {
    ASSERT_EQ(Cli("init").rc, 0);
    CliRun b =
        Cli(absl::StrCat("base add q --config ", Quote(dir_.file("config.json")), " --json"));
    ASSERT_EQ(b.rc, 0) << b.err;
    EXPECT_EQ(b.json()["name"], "q");
  }

  TempDir dir_;
  std::string store_;
  std::vector<std::unique_ptr<std::vector<float>>> bufs_;
};

TEST_F(CliTest, ImportShowLsAliasRollbackExportVerify) {
  InitStore();
  CliRun r1 = Cli(absl::StrCat("import --policy t/p --base q --alias serving ",
                               Quote(dir_.file("a1")), " --json"));
  ASSERT_EQ(r1.rc, 0) << r1.err;
  auto j1 = r1.json();
  EXPECT_EQ(j1["id"], 1);
  EXPECT_EQ(j1["policy"], "t/p");
  EXPECT_EQ(j1["seq"], 1);
  EXPECT_EQ(j1["base"], "q");
  EXPECT_EQ(j1["tensors"], 2);
  EXPECT_GT(j1["bytes"].get<uint64_t>(), 0u);
  CliRun r2 = Cli(absl::StrCat("import --policy t/p ", Quote(dir_.file("a2")), " --json"));
  ASSERT_EQ(r2.rc, 0) << r2.err;
  EXPECT_EQ(r2.json()["seq"], 2);

  CliRun show = Cli("show --json t/p:latest");
  ASSERT_EQ(show.rc, 0) << show.err;
  EXPECT_EQ(show.json()["id"], 2);
  EXPECT_EQ(Cli("show --json t/p:serving").json()["id"], 1);
  EXPECT_EQ(Cli("show --json 1").json()["aliases"][0], "serving");
  EXPECT_EQ(Cli("show --json t/p@2").json()["id"], 2);

  CliRun page1 = Cli("ls --json --limit 1");
  ASSERT_EQ(page1.rc, 0);
  ASSERT_EQ(page1.json().size(), 1u);
  EXPECT_NE(page1.err.find("more: --after 1"), std::string::npos) << page1.err;
  CliRun page2 =
      Cli(absl::StrCat("ls --json --limit 1 --after ", page1.json()[0]["cursor"].get<uint64_t>()));
  ASSERT_EQ(page2.json().size(), 1u);
  EXPECT_EQ(page2.json()[0]["id"], 2);
  EXPECT_EQ(Cli("ls --json --policy t/p --after 1").json().size(), 1u);

  CliRun al = Cli("alias t/p serving 2 --json");
  ASSERT_EQ(al.rc, 0) << al.err;
  EXPECT_EQ(al.json()["revision"], 2);
  CliRun rb = Cli("rollback t/p serving --json");
  ASSERT_EQ(rb.rc, 0) << rb.err;
  EXPECT_EQ(rb.json()["revision"], 1);
  EXPECT_EQ(Cli("show --json t/p:serving").json()["id"], 1);

  ASSERT_EQ(Cli(absl::StrCat("export t/p:serving ", Quote(dir_.file("out")))).rc, 0);
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors"}) {
    EXPECT_EQ(ReadFileToString(dir_.file(absl::StrCat("a1/", f))).value_or("a"),
              ReadFileToString(dir_.file(absl::StrCat("out/", f))).value_or("b"))
        << f;
  }
  CliRun rm = Cli("rm 2 --json");
  ASSERT_EQ(rm.rc, 0) << rm.err;
  EXPECT_EQ(Cli("ls --json --limit 0").json().size(), 1u);
  CliRun v = Cli("verify --json");
  ASSERT_EQ(v.rc, 0) << v.err;
  EXPECT_TRUE(v.json()["ok"].get<bool>());
  EXPECT_EQ(v.json()["reclaimable"].size(), 1u);  // the deleted revision's blob
}

TEST_F(CliTest, FailedCommandsLeaveTheStoreUnchanged) {
  ExpectFails("ls", "no store at");
  EXPECT_FALSE(std::filesystem::exists(store_));
  InitStore();
  ASSERT_EQ(
      Cli(absl::StrCat("import --policy t/p --base q --alias serving ", Quote(dir_.file("a1")))).rc,
      0);
  const std::string before = Snapshot();
  ExpectFails(absl::StrCat("import --policy t/p ", Quote(dir_.file("wide"))), "module");
  ExpectFails(absl::StrCat("import --policy t/new --base q ", Quote(dir_.file("wide"))), "module");
  ExpectFails(absl::StrCat("import --policy t/new ", Quote(dir_.file("a1"))), "--base");
  ExpectFails(absl::StrCat("import --policy t/p --base other ", Quote(dir_.file("a1"))),
              "bound to base");
  ExpectFails(absl::StrCat("import --policy t/p ", Quote(dir_.file("missing"))), "missing");
  ExpectFails(absl::StrCat("import --policy t/p --alias 'bad alias' ", Quote(dir_.file("a2"))),
              "alias");
  ExpectFails(absl::StrCat("import --policy t/p --alias latest ", Quote(dir_.file("a2"))),
              "reserved");
  ExpectFails("alias t/p serving 99", "no revision");
  ExpectFails("alias t/p serving t/p:nope", "no alias");
  ExpectFails("rollback t/p serving", "no earlier value");
  ExpectFails("rollback t/p canary", "never set");
  ExpectFails("rm 1", "alias");
  ExpectFails("rm 42", "no revision");
  ExpectFails("show what", "bad revision reference");
  ExpectFails(absl::StrCat("base add q --config ", Quote(dir_.file("config.json"))),
              "already exists");
  ExpectFails(absl::StrCat("base add z --config ", Quote(dir_.file("nope.json"))), "nope.json");
  ExpectFails("base add z", "exactly one");
  ExpectFails("policy create '/bad' --base q", "must start");
  ExpectFails("policy create t/p --base q", "already exists");
  ExpectFails("policy create t/x --base nobase", "no base");
  ExpectFails("policy create t/x --base q --label novalue", "KEY=VALUE");
  ExpectFails(absl::StrCat("export 42 ", Quote(dir_.file("x"))), "no revision");
  ExpectFails("frobnicate", "");
  EXPECT_EQ(Snapshot(), before);
}

TEST_F(CliTest, VerifyFailsOnCorruptBlob) {
  InitStore();
  CliRun r = Cli(absl::StrCat("import --policy t/p --base q ", Quote(dir_.file("a1")), " --json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  CliRun show = Cli("show --json 1");
  const std::string path = show.json()["blob_path"];
  auto bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomic(path, *bytes).ok());
  ExpectFails("verify", "xxh3-128");
  ExpectFails(absl::StrCat("export 1 ", Quote(dir_.file("o"))), "corrupt");
}

}  // namespace
}  // namespace loradb
