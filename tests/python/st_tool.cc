// Test helper for the Python oracle scripts: exposes loradb's safetensors reader/writer.
//   st_tool check IN          exit 0 if loradb reads IN, else print the error and exit 1
//   st_tool rewrite IN OUT    read IN, write it again with loradb's writer to OUT
//   st_tool to-blob IN OUT [--no-pack]   safetensors IN -> loradb blob OUT
//   st_tool from-blob IN OUT  loradb blob IN (checksums verified) -> safetensors OUT
//   st_tool peft-scales DIR   read a PEFT dir; print "module_key rank scale" per LoRA A/B module
//   st_tool peft-rewrite DIR OUT   read a PEFT dir and write it again to OUT
#include <cstdio>
#include <set>
#include <string>

#include "storage/formats/blob.h"
#include "storage/formats/peft.h"
#include "storage/formats/safetensors.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loradb;  // NOLINT(build/namespaces): a test tool
  std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "check" && argc == 3) {
    auto set = safetensors::ReadFile(argv[2]);
    if (!set.ok()) return Fail(set.status());
    std::printf("ok %zu tensors\n", set->size());
    return 0;
  }
  if (cmd == "rewrite" && argc == 4) {
    auto set = safetensors::ReadFile(argv[2]);
    if (!set.ok()) return Fail(set.status());
    absl::Status st = safetensors::WriteFile(argv[3], set->tensors(), set->metadata());
    if (!st.ok()) return Fail(st);
    return 0;
  }
  if (cmd == "to-blob" && (argc == 4 || (argc == 5 && std::string(argv[4]) == "--no-pack"))) {
    auto set = safetensors::ReadFile(argv[2]);
    if (!set.ok()) return Fail(set.status());
    auto info =
        WriteBlobFile(argv[3], set->tensors(), set->metadata(), BlobOptions{.pack_moe = argc == 4});
    if (!info.ok()) return Fail(info.status());
    return 0;
  }
  if (cmd == "from-blob" && argc == 4) {
    auto set = ReadBlobFile(argv[2], /*verify=*/true);
    if (!set.ok()) return Fail(set.status());
    absl::Status st = safetensors::WriteFile(argv[3], set->tensors(), set->metadata());
    if (!st.ok()) return Fail(st);
    return 0;
  }
  if (cmd == "peft-scales" && argc == 3) {
    auto adapter = peft::ReadPeftDir(argv[2]);
    if (!adapter.ok()) return Fail(adapter.status());
    std::set<std::string> keys;
    for (const TensorView& t : adapter->tensors.tensors()) {
      // LoRA A/B modules only: DoRA magnitudes, full weights, ... have no scale of their own.
      const peft::PeftTensorInfo info = peft::ClassifyPeftTensor(t.name);
      if (info.kind == peft::PeftTensorKind::kLora) keys.insert(info.module_key);
    }
    for (const std::string& k : keys) {
      std::printf("%s %d %.17g\n", k.c_str(), adapter->config.RankFor(k),
                  adapter->config.ScaleFor(k));
    }
    return 0;
  }
  if (cmd == "peft-rewrite" && argc == 4) {
    auto adapter = peft::ReadPeftDir(argv[2]);
    if (!adapter.ok()) return Fail(adapter.status());
    absl::Status st = peft::WritePeftDir(argv[3], adapter->config, adapter->tensors.tensors());
    if (!st.ok()) return Fail(st);
    return 0;
  }
  std::fprintf(
      stderr,
      "usage: st_tool check IN | rewrite IN OUT | to-blob IN OUT [--no-pack] | from-blob IN OUT | "
      "peft-scales DIR | peft-rewrite DIR OUT\n");
  return 2;
}
