// Scenario `formats`: a synthetic Qwen3-30B-A3B-shaped rank-1 bf16 MoE adapter (37,248 tensors)
// stored as safetensors, as a packed blob (MoE experts stacked: 672 stored tensors) and as an
// unpacked blob. Per format: file bytes, tensor counts, write time, header parse + index time,
// time to open and get a view of every tensor, time to copy every tensor out (page cache warm),
// and the same from a cold page cache (posix_fadvise DONTNEED on the file first).
//
//   loradb-bench formats [--layers N] [--experts N] [--reps N] [--dir DIR] [--keep]
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "storage/formats/blob.h"
#include "storage/formats/safetensors.h"
#include "storage/formats/synthetic.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb::bench {
namespace {

constexpr char kBench[] = "formats";

struct Options {
  SyntheticMoeSpec spec;
  int reps = 5;
  std::string dir;
  bool keep = false;
};

absl::StatusOr<Options> ParseArgs(const std::vector<std::string>& args) {
  Options o;
  CLI::App app("formats: read a synthetic MoE adapter as safetensors, packed and unpacked blob",
               "formats");
  app.add_option("--layers", o.spec.layers, "decoder layers of the synthetic adapter")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--experts", o.spec.experts, "experts per layer")->check(CLI::NonNegativeNumber);
  app.add_option("--reps", o.reps, "repetitions of each read (at least 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--dir", o.dir, "work directory (default: a temporary one)");
  app.add_flag("--keep", o.keep, "keep the work directory");
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  return o;
}

// Drops `path`'s pages from the page cache (clean pages only; affects no other file).
void EvictFromPageCache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

enum class Kind { kSafetensors, kBlob, kBlobUnpacked };

absl::StatusOr<TensorSet> Open(Kind kind, const std::string& path, bool verify = false) {
  if (kind == Kind::kSafetensors) return safetensors::ReadFile(path);
  return ReadBlobFile(path, verify);
}

struct Figures {
  double open_index_ms = 0;     // mmap + header parse + name index
  double open_view_all_ms = 0;  // open_index + a view of every original tensor by name
  double copy_all_ms = 0;       // open + copy every original tensor out by name (warm cache)
  double copy_stored_ms = 0;    // open + copy every stored tensor (blobs: packed groups whole)
  double cold_copy_all_ms = 0;  // as copy_all, page cache dropped for the file first
  double verify_ms = 0;         // blobs: open with every tensor checksum verified
};

double Median(std::vector<double> v) { return Quantile(std::move(v), 0.5); }

absl::StatusOr<Figures> Measure(Kind kind, const std::string& path,
                                const std::vector<std::string>& names, size_t total_bytes,
                                int reps) {
  std::vector<double> open_ms, view_ms, copy_ms, stored_ms, cold_ms, verify_ms;
  std::vector<std::byte> arena(total_bytes);
  uint64_t sink = 0;
  auto copy_all = [&](const TensorSet& set) -> absl::Status {
    size_t at = 0;
    for (const std::string& n : names) {
      const TensorView* v = set.Find(n);
      if (v == nullptr) return absl::InternalError("missing tensor " + n);
      std::memcpy(arena.data() + at, v->data, v->nbytes);
      at += v->nbytes;
    }
    sink += static_cast<uint64_t>(arena[at / 2]);
    return absl::OkStatus();
  };
  for (int r = 0; r < reps; ++r) {
    double t0 = NowSeconds();
    LORADB_ASSIGN_OR_RETURN(TensorSet set, Open(kind, path));
    double t1 = NowSeconds();
    for (const std::string& n : names) {
      const TensorView* v = set.Find(n);
      if (v == nullptr) return absl::InternalError("missing tensor " + n);
      sink += reinterpret_cast<uintptr_t>(v->data) + v->nbytes;
    }
    double t2 = NowSeconds();
    open_ms.push_back((t1 - t0) * 1e3);
    view_ms.push_back((t2 - t0) * 1e3);

    double c0 = NowSeconds();
    LORADB_ASSIGN_OR_RETURN(TensorSet again, Open(kind, path));
    LORADB_RETURN_IF_ERROR(copy_all(again));
    copy_ms.push_back((NowSeconds() - c0) * 1e3);

    double s0 = NowSeconds();
    TensorSet stored;
    if (kind == Kind::kSafetensors) {
      LORADB_ASSIGN_OR_RETURN(stored, safetensors::ReadFile(path));
    } else {
      LORADB_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
      auto holder = std::make_shared<MappedFile>(std::move(mapped));
      LORADB_ASSIGN_OR_RETURN(stored, ParseBlobStored(holder->bytes(), holder, false));
    }
    size_t at = 0;
    for (const TensorView& v : stored.tensors()) {
      std::memcpy(arena.data() + at, v.data, v.nbytes);
      at += v.nbytes;
    }
    stored_ms.push_back((NowSeconds() - s0) * 1e3);

    EvictFromPageCache(path);
    double k0 = NowSeconds();
    LORADB_ASSIGN_OR_RETURN(TensorSet cold, Open(kind, path));
    LORADB_RETURN_IF_ERROR(copy_all(cold));
    cold_ms.push_back((NowSeconds() - k0) * 1e3);

    if (kind != Kind::kSafetensors) {
      double v0 = NowSeconds();
      LORADB_ASSIGN_OR_RETURN(TensorSet verified, Open(kind, path, /*verify=*/true));
      verify_ms.push_back((NowSeconds() - v0) * 1e3);
      sink += verified.size();
    }
  }
  if (sink == 42) Progress("");  // keeps the loops observable
  Figures f;
  f.open_index_ms = Median(open_ms);
  f.open_view_all_ms = Median(view_ms);
  f.copy_all_ms = Median(copy_ms);
  f.copy_stored_ms = Median(stored_ms);
  f.cold_copy_all_ms = Median(cold_ms);
  f.verify_ms = verify_ms.empty() ? 0 : Median(verify_ms);
  return f;
}

absl::Status Run(const std::vector<std::string>& args) {
  LORADB_ASSIGN_OR_RETURN(Options o, ParseArgs(args));
  bool made_dir = false;
  if (o.dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "loradb-bench-formats-XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoToStatus(errno, "mkdtemp");
    o.dir = tmpl;
    made_dir = true;
  } else {
    LORADB_RETURN_IF_ERROR(CreateDirectories(o.dir));
  }
  struct Cleanup {
    std::string dir;
    bool active;
    ~Cleanup() {
      std::error_code ec;
      if (active) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{o.dir, made_dir && !o.keep};

  Progress(absl::StrCat("formats: building a synthetic adapter: ", o.spec.layers, " layers x ",
                        o.spec.experts, " experts, rank ", o.spec.rank, ", ",
                        DTypeName(o.spec.dtype)));
  double g0 = NowSeconds();
  LORADB_ASSIGN_OR_RETURN(TensorSet adapter, MakeSyntheticMoeAdapter(o.spec));
  double gen_s = NowSeconds() - g0;
  std::vector<std::string> names;
  names.reserve(adapter.size());
  for (const TensorView& t : adapter.tensors()) names.push_back(t.name);
  const size_t total_bytes = adapter.total_bytes();
  Emit({{"bench", kBench},
        {"case", "synthetic"},
        {"layers", o.spec.layers},
        {"experts", o.spec.experts},
        {"rank", o.spec.rank},
        {"dtype", DTypeName(o.spec.dtype)},
        {"tensors", adapter.size()},
        {"tensor_bytes", total_bytes},
        {"generate_s", gen_s}});

  const std::string st_path = o.dir + "/adapter.safetensors";
  const std::string blob_path = o.dir + "/adapter.blob";
  const std::string unpacked_path = o.dir + "/adapter.unpacked.blob";
  Progress("formats: writing safetensors, packed blob, unpacked blob to " + o.dir);
  double w0 = NowSeconds();
  LORADB_RETURN_IF_ERROR(safetensors::WriteFile(st_path, adapter.tensors(), adapter.metadata()));
  double w1 = NowSeconds();
  LORADB_ASSIGN_OR_RETURN(BlobFileInfo packed,
                          WriteBlobFile(blob_path, adapter.tensors(), adapter.metadata()));
  double w2 = NowSeconds();
  LORADB_ASSIGN_OR_RETURN(BlobFileInfo unpacked,
                          WriteBlobFile(unpacked_path, adapter.tensors(), adapter.metadata(),
                                        BlobOptions{.pack_moe = false}));
  double w3 = NowSeconds();
  const uint64_t st_bytes = std::filesystem::file_size(st_path);

  // Lossless: safetensors -> packed blob -> safetensors gives the same file, byte for byte.
  bool round_trip = false;
  {
    LORADB_ASSIGN_OR_RETURN(TensorSet st, safetensors::ReadFile(st_path));
    LORADB_ASSIGN_OR_RETURN(std::string blob, SerializeBlob(st.tensors(), st.metadata()));
    auto holder = std::make_shared<std::string>(std::move(blob));
    LORADB_ASSIGN_OR_RETURN(
        TensorSet back,
        ParseBlob({reinterpret_cast<const std::byte*>(holder->data()), holder->size()}, holder,
                  true));
    LORADB_ASSIGN_OR_RETURN(std::string again,
                            safetensors::Serialize(back.tensors(), back.metadata()));
    LORADB_ASSIGN_OR_RETURN(std::string original, ReadFileToString(st_path));
    round_trip = again == original;
  }
  adapter = TensorSet();  // free the generator's buffer before measuring

  struct Case {
    const char* name;
    Kind kind;
    std::string path;
    uint64_t bytes;
    double write_s;
  };
  const Case cases[] = {
      {"safetensors", Kind::kSafetensors, st_path, st_bytes, w1 - w0},
      {"blob_packed", Kind::kBlob, blob_path, packed.bytes, w2 - w1},
      {"blob_unpacked", Kind::kBlobUnpacked, unpacked_path, unpacked.bytes, w3 - w2},
  };
  std::map<std::string, Figures> figures;
  std::map<std::string, size_t> stored_counts;
  for (const Case& c : cases) {
    Progress(absl::StrCat("formats: measuring ", c.name, " (", o.reps, " reps)"));
    size_t stored = names.size();
    if (c.kind != Kind::kSafetensors) {
      LORADB_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(c.path));
      LORADB_ASSIGN_OR_RETURN(BlobLayout layout, ParseBlobLayout(mapped.bytes(), mapped.size()));
      stored = layout.stored.size();
    }
    stored_counts[c.name] = stored;
    LORADB_ASSIGN_OR_RETURN(Figures f, Measure(c.kind, c.path, names, total_bytes, o.reps));
    figures[c.name] = f;
    nlohmann::json line = {{"bench", kBench},
                           {"case", c.name},
                           {"reps", o.reps},
                           {"file_bytes", c.bytes},
                           {"tensors", names.size()},
                           {"stored_tensors", stored},
                           {"write_s", c.write_s},
                           {"open_index_ms_p50", f.open_index_ms},
                           {"open_view_all_ms_p50", f.open_view_all_ms},
                           {"copy_all_ms_p50", f.copy_all_ms},
                           {"copy_stored_ms_p50", f.copy_stored_ms},
                           {"cold_copy_all_ms_p50", f.cold_copy_all_ms}};
    if (c.kind != Kind::kSafetensors) line["open_verify_ms_p50"] = f.verify_ms;
    Emit(line);
  }

  const Figures& st = figures["safetensors"];
  const Figures& bl = figures["blob_packed"];
  const double want_tensors = static_cast<double>(o.spec.tensor_count());
  const double want_stored = 2.0 * o.spec.layers * (4 + (o.spec.experts > 0 ? 3 : 0));
  EmitGoal(kBench, "tensor_count", static_cast<double>(names.size()),
           absl::StrCat("== ", want_tensors), static_cast<double>(names.size()) == want_tensors);
  EmitGoal(kBench, "packed_stored_tensors", static_cast<double>(stored_counts["blob_packed"]),
           absl::StrCat("== ", want_stored),
           static_cast<double>(stored_counts["blob_packed"]) == want_stored);
  double ratio = static_cast<double>(packed.bytes) / static_cast<double>(st_bytes);
  EmitGoal(kBench, "packed_blob_bytes_over_safetensors", ratio, "< 1", ratio < 1);
  EmitGoal(kBench, "round_trip_bit_exact", round_trip ? 1 : 0, "== 1", round_trip);
  double open_speedup = st.open_index_ms / bl.open_index_ms;
  EmitGoal(kBench, "header_parse_index_speedup_blob_vs_safetensors", open_speedup, ">= 1",
           open_speedup >= 1);
  double view_speedup = st.open_view_all_ms / bl.open_view_all_ms;
  EmitGoal(kBench, "open_view_all_speedup_blob_vs_safetensors", view_speedup, ">= 1",
           view_speedup >= 1);
  double read_speedup = st.copy_all_ms / bl.copy_stored_ms;
  EmitGoal(kBench, "tensor_read_speedup_packed_vs_per_tensor", read_speedup, ">= 1",
           read_speedup >= 1);
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({kBench,
                          "synthetic Qwen3-30B-A3B rank-1 MoE adapter: safetensors vs packed blob "
                          "(bytes, parse+index, open+view all, copy all)",
                          Run,
                          {"--reps", "3"}});

}  // namespace
}  // namespace loradb::bench
