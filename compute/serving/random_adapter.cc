#include "compute/serving/random_adapter.h"

#include <algorithm>
#include <random>
#include <vector>

#include "storage/formats/peft.h"
#include "storage/util/status_macros.h"

namespace loradb::serving {

absl::StatusOr<RevisionRecord> PublishRandomAdapter(Store& store, const std::string& base,
                                                    const std::string& policy,
                                                    const std::string& alias,
                                                    const RandomAdapterSpec& spec) {
  LORADB_ASSIGN_OR_RETURN(BaseRecord b, store.GetBase(base));
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> normal(0.0f, spec.stddev);
  std::vector<std::vector<float>> data;
  std::vector<TensorView> views;
  // The modules' last name components (q_proj, ...), so that an export names its targets and
  // PEFT does not fall back to its per-architecture default targets.
  std::vector<std::string> targets;
  for (const ModuleShape& m : b.modules) {
    if (m.name.find("_proj") == std::string::npos) continue;  // embeddings, router, head
    const std::string leaf = m.name.substr(m.name.rfind('.') + 1);
    if (std::find(targets.begin(), targets.end(), leaf) == targets.end()) targets.push_back(leaf);
    for (const peft::LoraSide side : {peft::LoraSide::kA, peft::LoraSide::kB}) {
      const std::vector<int64_t> shape = side == peft::LoraSide::kA
                                             ? std::vector<int64_t>{spec.rank, m.in}
                                             : std::vector<int64_t>{m.out, spec.rank};
      std::vector<float>& values = data.emplace_back(static_cast<size_t>(shape[0] * shape[1]));
      for (float& v : values) v = normal(rng);
      TensorView t;
      t.name = peft::PeftTensorNameFor("model." + m.name, side, false);
      t.dtype = DType::kF32;
      t.shape = shape;
      t.data = reinterpret_cast<const std::byte*>(values.data());
      t.nbytes = values.size() * sizeof(float);
      views.push_back(std::move(t));
    }
  }
  PublishOptions o;
  o.alias = alias;
  o.create_policy_base = base;
  o.lora.r = static_cast<int32_t>(spec.rank);
  o.lora.alpha = spec.alpha;
  o.lora.target_modules = std::move(targets);
  return store.PublishTensors(policy, views, o);
}

}  // namespace loradb::serving
