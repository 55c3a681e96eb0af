// The weights fingerprint of a base: xxh3-128 over its tensors' bytes, tensors taken in
// ascending name order (byte-wise), bytes as stored (no dtype conversion). Two checkpoints
// with the same tensors have the same fingerprint however they are sharded or ordered on disk.
#ifndef LORADB_STORAGE_FORMATS_WEIGHTS_FINGERPRINT_H_
#define LORADB_STORAGE_FORMATS_WEIGHTS_FINGERPRINT_H_

#include "storage/formats/tensor.h"
#include "storage/util/hash.h"

namespace loradb {

Hash128 WeightsFingerprint(const TensorSet& tensors);

}  // namespace loradb

#endif  // LORADB_STORAGE_FORMATS_WEIGHTS_FINGERPRINT_H_
