#include "compute/distributed/tp_decode.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compute/distributed/tp_model.h"
#include "storage/formats/peft.h"
#include "storage/store/lora_peft.h"
#include "storage/store/store.h"
#include "storage/store/store_tiers.h"
#include "storage/tiers/host_buffer.h"
#include "storage/util/status_macros.h"

namespace loradb::distributed {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

absl::StatusOr<TensorSet> MakeRandomLoraTensors(const ModelConfig& config, int64_t rank,
                                                uint64_t seed, double stddev) {
  if (rank < 1) return absl::InvalidArgumentError("LoRA rank must be >= 1");
  try {
    at::Generator g = at::detail::createCPUGenerator(seed);
    std::vector<std::pair<std::string, at::Tensor>> made;
    uint64_t total = 0;
    for (const ModuleShape& m : config.LoraModules()) {
      if (m.name.find("_proj") == std::string::npos) continue;  // embeddings, router, head
      const std::string key = "model." + m.name;
      at::Tensor a = at::randn({rank, m.in}, g, at::kFloat) * stddev;
      at::Tensor b = at::randn({m.out, rank}, g, at::kFloat) * stddev;
      made.emplace_back(peft::PeftTensorNameFor(key, peft::LoraSide::kA, false), a);
      made.emplace_back(peft::PeftTensorNameFor(key, peft::LoraSide::kB, false), b);
      total += tiers::AlignUp(static_cast<uint64_t>(a.nbytes()), 64) +
               tiers::AlignUp(static_cast<uint64_t>(b.nbytes()), 64);
    }
    LORADB_ASSIGN_OR_RETURN(std::unique_ptr<tiers::HostBuffer> owned,
                            tiers::HostBuffer::Allocate(total == 0 ? 64 : total, false));
    std::shared_ptr<tiers::HostBuffer> buf(std::move(owned));
    TensorSet out(buf);
    uint64_t offset = 0;
    for (const auto& [name, t] : made) {
      const auto n = static_cast<size_t>(t.nbytes());
      std::memcpy(buf->data() + offset, t.data_ptr(), n);
      LORADB_RETURN_IF_ERROR(
          out.Add(TensorView{name, DType::kF32, t.sizes().vec(), buf->data() + offset, n}));
      offset += tiers::AlignUp(n, 64);
    }
    return out;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("MakeRandomLoraTensors: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<TpDecodeResult> RunTpDecode(const TpDecodeOptions& options, const TpShardSpec& spec,
                                           const model::PartialSumReducer* reducer) {
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  if (spec.degree > 1 && reducer == nullptr) {
    return absl::InvalidArgumentError("TP degree > 1 needs a reducer (a process group)");
  }
  if (options.sequences < 1 || options.prompt_len < 1 || options.steps < 0) {
    return absl::InvalidArgumentError("sequences and prompt_len must be >= 1, steps >= 0");
  }
  TpDecodeResult result;
  const auto t_load = std::chrono::steady_clock::now();
  LORADB_ASSIGN_OR_RETURN(ModelConfig whole, ReadModelConfig(options.model_dir));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<model::Qwen3Model> m,
                          LoadTpModel(options.model_dir, spec, {std::nullopt, options.device}));
  m->set_partial_sum_reducer(reducer);
  result.local_heads = m->config().num_attention_heads;

  // The adapters: one batch lease on this rank's device tier, placed for this rank (declared
  // before the adapters that read the slots' memory, so it is released after them).
  std::unique_ptr<Store> store;
  std::unique_ptr<tiers::StoreTiers> tiers;
  tiers::DeviceBatchLease lease;
  std::vector<std::unique_ptr<model::LoraAdapter>> adapters;
  if (!options.revisions.empty()) {
    StoreOptions so;
    so.create_if_missing = false;
    LORADB_ASSIGN_OR_RETURN(store, Store::Open(options.store_dir, so));
    std::vector<RevisionRecord> records;
    for (uint64_t id : options.revisions) {
      LORADB_ASSIGN_OR_RETURN(RevisionRecord rec, store->GetRevision(id));
      result.adapter_whole_bytes += rec.blob.bytes;
      records.push_back(std::move(rec));
    }
    tiers::StoreTiersOptions to;
    to.device = options.device.is_cuda() ? tiers::DeviceKind::kCuda : tiers::DeviceKind::kHost;
    to.cuda_device = options.device.is_cuda() ? options.device.index() : 0;
    to.slots.tp = spec;
    to.tp_derived_dir = options.derived_dir;
    // Room for every whole revision (a shard is smaller) plus page rounding per chunk.
    to.slots.page_bytes = 64 << 10;
    to.slots.arena_bytes =
        tiers::AlignUp(result.adapter_whole_bytes + result.adapter_whole_bytes / 16 +
                           (uint64_t{1} << 20) * (options.revisions.size() + 1),
                       to.slots.page_bytes);
    LORADB_ASSIGN_OR_RETURN(tiers, tiers::StoreTiers::Open(store.get(), to));
    LORADB_ASSIGN_OR_RETURN(lease, tiers->device()->AcquireBatch(options.revisions));
    const at::Device slot_device =
        tiers->device()->backend().is_device() ? options.device : at::Device(at::kCPU);
    for (const RevisionRecord& rec : records) {
      const tiers::DeviceAdapter* slot = lease.Find(rec.id);
      if (slot == nullptr) {
        return absl::InternalError(absl::StrCat("revision ", rec.id, " is not in the lease"));
      }
      result.adapter_slot_bytes += slot->bytes;
      LORADB_ASSIGN_OR_RETURN(
          model::LoraAdapter a,
          BuildTpAdapterFromSlot(*m, *slot, spec, ToPeftConfig(rec.lora), slot_device));
      adapters.push_back(std::make_unique<model::LoraAdapter>(std::move(a)));
    }
  }
  result.load_ms = MsSince(t_load);

  try {
    const int64_t n = options.sequences, vocab = whole.vocab_size;
    const auto num_adapters = static_cast<int64_t>(adapters.size());
    model::LoraBatch lora;
    for (const auto& a : adapters) lora.adapters.push_back(a.get());
    std::vector<int32_t> seq_slot(static_cast<size_t>(n));
    for (int64_t s = 0; s < n; ++s) {
      const int64_t k = s % (num_adapters + 1);
      seq_slot[static_cast<size_t>(s)] = k == num_adapters ? -1 : static_cast<int32_t>(k);
    }
    model::KvCache cache = m->NewKvCache();
    model::ForwardInput in;
    std::vector<int64_t> ids;
    for (int64_t s = 0; s < n; ++s) {
      in.cache_seqs.push_back(cache.AddSequence(options.prompt_len + options.steps + 1));
      in.seq_lens.push_back(options.prompt_len);
      for (int64_t i = 0; i < options.prompt_len; ++i) {
        ids.push_back(static_cast<int64_t>(
            (options.seed * 31 + static_cast<uint64_t>(s) * 7 + static_cast<uint64_t>(i) * 13) %
            static_cast<uint64_t>(vocab)));
        lora.row_slot.push_back(seq_slot[static_cast<size_t>(s)]);
      }
    }
    in.lora = num_adapters > 0 ? &lora : nullptr;
    in.last_row_logits_only = true;
    result.tokens.assign(static_cast<size_t>(n), {});
    for (int64_t step = 0; step <= options.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      in.token_ids = at::from_blob(ids.data(), {static_cast<int64_t>(ids.size())}, at::kLong);
      LORADB_ASSIGN_OR_RETURN(model::ForwardOutput out, m->Forward(in, &cache));
      at::Tensor logits = out.logits.to(at::kCPU, at::kFloat).contiguous();
      at::Tensor next = logits.argmax(-1).contiguous();
      const int64_t* next_ids = next.data_ptr<int64_t>();
      ids.assign(next_ids, next_ids + n);
      const double ms = MsSince(t0);
      if (step == 0) {
        result.prefill_ms = ms;
      } else {
        result.decode_ms += ms;
        result.decode_tokens += n;
      }
      for (int64_t s = 0; s < n; ++s) result.tokens[static_cast<size_t>(s)].push_back(ids[s]);
      if (options.record_logits) {
        const float* p = logits.data_ptr<float>();
        result.logits.emplace_back(p, p + n * vocab);
      }
      // Decode rows: one per sequence.
      in.seq_lens.assign(static_cast<size_t>(n), 1);
      lora.row_slot = seq_slot;
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("RunTpDecode: ", e.what_without_backtrace()));
  }
  return result;
}

}  // namespace loradb::distributed
