#include "storage/formats/weights_fingerprint.h"

#include <algorithm>
#include <vector>

namespace loradb {

Hash128 WeightsFingerprint(const TensorSet& tensors) {
  std::vector<const TensorView*> order;
  order.reserve(tensors.size());
  for (const TensorView& v : tensors.tensors()) order.push_back(&v);
  std::sort(order.begin(), order.end(),
            [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  Xxh3_128Stream stream;
  for (const TensorView* v : order) stream.Update(v->data, v->nbytes);
  return stream.Digest();
}

}  // namespace loradb
