// libFuzzer target for the blob reader (tools/dev fuzz blob_header SECONDS).
// The header checksum would stop almost every mutation at the door, so for most inputs the
// target first re-seals it (writes the correct xxh3-64 of prefix + header into its slot) and so
// reaches the FlatBuffers verifier and the layout checks. Whatever the bytes: no crash; when a
// blob is accepted, its views lie inside the input, and re-serializing its tensors gives a blob
// that parses to the same tensors.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "storage/formats/blob.h"
#include "storage/util/hash.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loradb;  // NOLINT(build/namespaces): fuzz target
  std::string buf(reinterpret_cast<const char*>(data), size);
  bool reseal = size > 0 && (data[size - 1] & 0x7) != 0;  // 7 in 8 inputs
  if (reseal && buf.size() >= kBlobPrefixBytes) {
    uint64_t header_len = 0;
    std::memcpy(&header_len, buf.data() + 16, 8);
    if (header_len <= buf.size() && buf.size() - header_len >= kBlobPrefixBytes + 8) {
      uint64_t sum = Xxh3_64(buf.data(), kBlobPrefixBytes + header_len);
      std::memcpy(buf.data() + kBlobPrefixBytes + header_len, &sum, 8);
    }
  }
  // Header-only parsing must agree with whole-file parsing about the header.
  auto end = BlobHeaderEnd(AsBytes(buf));
  auto layout = ParseBlobLayout(AsBytes(buf), buf.size());
  Check(end.ok() || !layout.ok());

  auto set = ParseBlob(AsBytes(buf), nullptr, /*verify_checksums=*/true);
  if (!set.ok()) return 0;
  Check(layout.ok());
  Check(set->size() == layout->original_count());
  const std::byte* lo = reinterpret_cast<const std::byte*>(buf.data());
  for (const TensorView& t : set->tensors()) {
    Check(t.data >= lo + layout->header_end && t.data + t.nbytes <= lo + buf.size());
  }
  auto again_bytes = SerializeBlob(set->tensors(), set->metadata());
  Check(again_bytes.ok());
  auto again = ParseBlob(AsBytes(*again_bytes), nullptr, true);
  Check(again.ok() && again->size() == set->size() && again->metadata() == set->metadata());
  for (const TensorView& t : set->tensors()) {
    const TensorView* u = again->Find(t.name);
    Check(u != nullptr && u->dtype == t.dtype && u->shape == t.shape && u->nbytes == t.nbytes);
    Check(t.nbytes == 0 || std::memcmp(u->data, t.data, t.nbytes) == 0);
  }
  return 0;
}
