// loradb_api_seed STORE_DIR [POLICIES] [REVISIONS_PER_POLICY]: creates a store for the HTTP
// integration tests and benchmarks with one base ("qwen3-tiny", an explicit module table),
// policies "team/p0".."team/pN-1", each with revisions whose blobs are synthetic references
// (catalog-only: no blob files), alias "serving" on each policy's first revision and one
// checkpoint per policy. Prints {"policies": [...], "revisions": [ids...]} as JSON.
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "storage/catalog/catalog.h"

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
  auto catalog = loradb::Catalog::Open(dir);
  if (!catalog.ok()) return Fail(catalog.status());
  loradb::BaseRecord base;
  base.name = "qwen3-tiny";
  base.arch.family = "custom";
  base.arch.hidden_size = 64;
  base.arch.num_layers = 2;
  for (int layer = 0; layer < 2; ++layer) {
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      base.modules.push_back({"layers." + std::to_string(layer) + ".self_attn." + proj, 64, 64});
    }
  }
  absl::Status st = (*catalog)->PutBase(base);
  if (!st.ok()) return Fail(st);
  nlohmann::json out = {{"policies", nlohmann::json::array()},
                        {"revisions", nlohmann::json::array()}};
  for (int p = 0; p < policies; ++p) {
    const std::string name = "team/p" + std::to_string(p);
    auto policy = (*catalog)->CreatePolicy(name, base.name, {{"owner", "tests"}});
    if (!policy.ok()) return Fail(policy.status());
    out["policies"].push_back(name);
    for (int r = 0; r < revisions; ++r) {
      loradb::NewRevision rev;
      rev.policy_id = policy->id;
      rev.source.origin = "seed";
      rev.source.content_hash = "seed-" + std::to_string(p) + "-" + std::to_string(r);
      rev.lora.r = 8;
      rev.lora.alpha = 16;
      rev.lora.target_modules = {"q_proj", "v_proj"};
      rev.dtype = "bf16";
      rev.blob.hash = loradb::Hash128{static_cast<uint64_t>(p + 1), static_cast<uint64_t>(r + 1)};
      rev.blob.bytes = 4096;
      rev.blob.tensors = 8;
      if (r == 0) rev.alias = "serving";
      auto rec = (*catalog)->Publish(rev, loradb::BlobRelPath(rev.blob.hash));
      if (!rec.ok()) return Fail(rec.status());
      out["revisions"].push_back(rec->id);
    }
    loradb::NewCheckpoint ckpt;
    ckpt.policy_id = policy->id;
    ckpt.step = 100;
    ckpt.scheduler_name = "cosine";
    ckpt.scheduler_position = 100;
    ckpt.rng_state = "rng";
    ckpt.master.hash = loradb::Hash128{static_cast<uint64_t>(p + 1), 999};
    ckpt.master.bytes = 4096;
    ckpt.master.tensors = 8;
    auto c = (*catalog)->PutCheckpoint(ckpt);
    if (!c.ok()) return Fail(c.status());
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
