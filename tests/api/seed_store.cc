// loradb_api_seed STORE_DIR [POLICIES] [REVISIONS_PER_POLICY]: creates a store for the HTTP
// integration tests and benchmarks with one base ("qwen3-tiny", an explicit module table),
// policies "team/p0".."team/pN-1", each with small rank-2 F32 revisions published through the
// Store (real blobs), alias "serving" on each policy's first revision and one checkpoint per
// policy. Prints {"policies": [...], "revisions": [ids...]} as JSON.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "storage/store/store.h"

namespace {

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s STORE_DIR [POLICIES] [REVISIONS_PER_POLICY]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int policies = argc > 2 ? std::atoi(argv[2]) : 3;
  const int revisions = argc > 3 ? std::atoi(argv[3]) : 4;
  auto store = loradb::Store::Open(dir);
  if (!store.ok()) return Fail(store.status());
  loradb::BaseRecord base;
  base.name = "qwen3-tiny";
  base.arch.family = "custom";
  base.arch.hidden_size = 16;
  base.arch.num_layers = 2;
  std::vector<std::string> modules;
  for (int layer = 0; layer < 2; ++layer) {
    for (const char* proj : {"q_proj", "v_proj"}) {
      modules.push_back("layers." + std::to_string(layer) + ".self_attn." + proj);
      base.modules.push_back({modules.back(), 16, 16});
    }
  }
  auto added = (*store)->AddBase(base);
  if (!added.ok()) return Fail(added.status());
  nlohmann::json out = {{"policies", nlohmann::json::array()},
                        {"revisions", nlohmann::json::array()}};
  constexpr int64_t kRank = 2, kDim = 16;
  for (int p = 0; p < policies; ++p) {
    const std::string name = "team/p" + std::to_string(p);
    auto policy = (*store)->CreatePolicy(name, base.name, {{"owner", "tests"}});
    if (!policy.ok()) return Fail(policy.status());
    out["policies"].push_back(name);
    for (int r = 0; r < revisions; ++r) {
      std::vector<std::unique_ptr<std::vector<float>>> bufs;
      std::vector<loradb::TensorView> views;
      for (const std::string& module : modules) {
        for (bool b : {false, true}) {
          auto buf = std::make_unique<std::vector<float>>(static_cast<size_t>(kRank * kDim));
          for (size_t i = 0; i < buf->size(); ++i) {
            (*buf)[i] = static_cast<float>(p * 1000 + r * 10) + static_cast<float>(i) * 0.5f;
          }
          loradb::TensorView v;
          v.name = "base_model.model.model." + module + (b ? ".lora_B.weight" : ".lora_A.weight");
          v.dtype = loradb::DType::kF32;
          v.shape = b ? std::vector<int64_t>{kDim, kRank} : std::vector<int64_t>{kRank, kDim};
          v.data = reinterpret_cast<const std::byte*>(buf->data());
          v.nbytes = buf->size() * sizeof(float);
          views.push_back(v);
          bufs.push_back(std::move(buf));
        }
      }
      loradb::PublishOptions opts;
      opts.lora.r = kRank;
      opts.lora.alpha = 4;
      opts.lora.target_modules = {"q_proj", "v_proj"};
      if (r == 0) opts.alias = "serving";
      auto rec = (*store)->PublishTensors(name, views, opts);
      if (!rec.ok()) return Fail(rec.status());
      out["revisions"].push_back(rec->id);
    }
    std::vector<float> master(static_cast<size_t>(kRank * kDim), 1.0f);
    loradb::CheckpointParts parts;
    loradb::TensorView mv;
    mv.name = "master";
    mv.dtype = loradb::DType::kF32;
    mv.shape = {kRank, kDim};
    mv.data = reinterpret_cast<const std::byte*>(master.data());
    mv.nbytes = master.size() * sizeof(float);
    parts.master = {mv};
    parts.scheduler_name = "cosine";
    parts.scheduler_position = 100;
    parts.rng_state = "rng";
    auto c = (*store)->PutCheckpoint(name, 100, 0, parts);
    if (!c.ok()) return Fail(c.status());
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
