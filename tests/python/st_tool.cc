// Test helper for the Python oracle scripts: exposes loradb's safetensors reader/writer.
//   st_tool check IN          exit 0 if loradb reads IN, else print the error and exit 1
//   st_tool rewrite IN OUT    read IN, write it again with loradb's writer to OUT
#include <cstdio>
#include <string>

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
  std::fprintf(stderr, "usage: st_tool check IN | rewrite IN OUT\n");
  return 2;
}
