// Conversions between a revision's LoRA settings (catalog records) and the PEFT adapter config
// that decides each module's scale (alpha / r, or / sqrt(r) with rsLoRA, per-module patterns).
// One definition for the store, the decoder, the trainer and the TP loader.
#ifndef LORADB_STORAGE_STORE_LORA_PEFT_H_
#define LORADB_STORAGE_STORE_LORA_PEFT_H_

#include "storage/catalog/records.h"
#include "storage/formats/peft.h"

namespace loradb {

// Rank patterns come first in `modules` (r != 0), alpha patterns after (has_alpha), each in
// their original order; FromPeftConfig(ToPeftConfig(s)) == s for settings built that way.
peft::LoraConfig ToPeftConfig(const LoraSettings& settings);
LoraSettings FromPeftConfig(const peft::LoraConfig& config);

}  // namespace loradb

#endif  // LORADB_STORAGE_STORE_LORA_PEFT_H_
