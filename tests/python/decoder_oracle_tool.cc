// Store steps of tests/python/decoder_oracle.py for builds whose `loradb` CLI has no
// import/export subcommands yet: register a base, import a PEFT directory, export a revision.
//   decoder_oracle_tool STORE base-add NAME CONFIG_JSON WEIGHTS
//   decoder_oracle_tool STORE import POLICY BASE ALIAS PEFT_DIR     (prints the revision id)
//   decoder_oracle_tool STORE export REF OUT_DIR
#include <cstdio>
#include <memory>
#include <string>

#include "storage/store/store.h"

namespace {

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s STORE base-add|import|export ARGS...\n", argv[0]);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<loradb::Store>> store = loradb::Store::Open(argv[1]);
  if (!store.ok()) return Fail(store.status());
  const std::string cmd = argv[2];
  if (cmd == "base-add" && argc == 6) {
    absl::StatusOr<loradb::BaseRecord> b = (*store)->AddBaseFromConfig(argv[3], argv[4], argv[5]);
    return b.ok() ? 0 : Fail(b.status());
  }
  if (cmd == "import" && argc == 7) {
    loradb::PublishOptions o;
    o.create_policy_base = argv[4];
    o.alias = argv[5];
    absl::StatusOr<loradb::RevisionRecord> r = (*store)->PublishPeftDir(argv[3], argv[6], o);
    if (!r.ok()) return Fail(r.status());
    std::printf("%llu\n", static_cast<unsigned long long>(r->id));
    return 0;
  }
  if (cmd == "export" && argc == 5) {
    absl::StatusOr<loradb::RevisionRecord> r = (*store)->Resolve(argv[3]);
    if (!r.ok()) return Fail(r.status());
    absl::Status st = (*store)->ExportPeftDir(*r, argv[4]);
    return st.ok() ? 0 : Fail(st);
  }
  std::fprintf(stderr, "bad command line\n");
  return 2;
}
