#include "compute/decoder/decoder_tools.h"

#include <ATen/Parallel.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compute/decoder/decoder.h"
#include "compute/model/kernel_lora_applier.h"
#include "compute/model/qwen3_model.h"
#include "storage/util/status_macros.h"

namespace loradb::decoder {

absl::StatusOr<std::vector<GenerateToolResult>> RunGenerate(const GenerateToolRequest& request) {
  if (request.prompts.empty()) return absl::InvalidArgumentError("no prompts");
  if (request.adapters.size() != request.prompts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected one adapter per prompt (",
                                                   request.prompts.size(), "), got ",
                                                   request.adapters.size()));
  }
  LORADB_ASSIGN_OR_RETURN(model::LoadOptions lo, ModelLoadOptions(request.dtype));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<model::Qwen3Model> model,
                          model::Qwen3Model::Load(request.model_dir, lo));
  model::KernelLoraApplier applier(at::get_num_threads());
  model->set_lora_applier(&applier);
  std::unique_ptr<Store> store;
  bool any_adapter = false;
  for (const std::string& a : request.adapters) any_adapter = any_adapter || !a.empty();
  if (any_adapter) {
    StoreOptions so;
    so.create_if_missing = false;
    LORADB_ASSIGN_OR_RETURN(store, Store::Open(request.store_dir, so));
  }
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Decoder> dec, Decoder::Create(model.get(), store.get()));
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    GenerateRequest g;
    g.adapter = request.adapters[i];
    g.prompt_ids = request.prompts[i];
    g.max_new_tokens = request.max_new_tokens;
    g.stop_token_ids = request.stop_token_ids;
    g.sampling.temperature = request.temperature;
    g.sampling.top_k = request.top_k;
    g.sampling.top_p = request.top_p;
    g.sampling.seed = request.seed + i;
    g.record_logits = request.record_logits;
    LORADB_ASSIGN_OR_RETURN(uint64_t id, dec->Submit(std::move(g)));
    ids.push_back(id);
  }
  LORADB_RETURN_IF_ERROR(dec->RunUntilIdle());
  std::vector<GenerateToolResult> out;
  for (uint64_t id : ids) {
    LORADB_ASSIGN_OR_RETURN(std::optional<GenerateResult> r, dec->Poll(id));
    if (!r.has_value()) return absl::InternalError("request still running after RunUntilIdle");
    if (r->finish == FinishReason::kError) return r->status;
    GenerateToolResult t;
    t.revision = r->revision;
    t.tokens = std::move(r->tokens);
    t.finish = FinishReasonName(r->finish);
    t.deferred_steps = r->deferred_steps;
    t.logits = std::move(r->logits);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace loradb::decoder
