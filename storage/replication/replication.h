// Catalog replication by shipping snapshots (docs/distributed.md). One writer process owns a
// store's catalog; a ReplicaPublisher in that process (or beside it on the same node) copies the
// catalog into numbered, immutable generations under `<store>/replica/`:
//
//   <store>/replica/LOCK                      flock held by the one publisher
//   <store>/replica/CURRENT                   "gen-<20 digits>\n", replaced atomically
//   <store>/replica/gen-<20 digits>/catalog/data.mdb   compacted LMDB copy (mdb_env_copy2)
//   <store>/replica/gen-<20 digits>/MANIFEST.json      generation, store id, txnid, size, xxh3,
//                                                      writer epoch
//   <store>/replica/epoch-<20 digits>         one file per writer epoch, created O_EXCL
//
// Fencing: each publisher takes a new writer epoch when it opens (the next epoch-N file,
// created with O_EXCL, so two writers never hold the same epoch even where flock is not
// trusted, e.g. a shared file system after a failover). Before building a generation and again
// before naming it in CURRENT, a publisher checks that no newer epoch exists; a fenced (stale)
// publisher gets FailedPrecondition and changes nothing a follower reads. Manifests record the
// epoch, and a follower never moves to a generation of a lower epoch than the one it serves.
// A generation is built under a `tmp-` name, fsynced, renamed into place, and only then named by
// CURRENT, so a reader never sees a partial one. Engines hold a ReplicaFollower: a read-only
// Store over the newest generation they have verified, with the shared blob root, swapped on
// Refresh() when CURRENT names a newer generation.
#ifndef LORADB_STORAGE_REPLICATION_REPLICATION_H_
#define LORADB_STORAGE_REPLICATION_REPLICATION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/catalog/catalog.h"
#include "storage/store/store.h"
#include "storage/util/hash.h"
#include "storage/util/mutex.h"

namespace loradb {

// What a generation's MANIFEST.json records.
struct GenerationManifest {
  uint64_t generation = 0;
  std::string store_id;
  // Lower bound of the catalog transaction the copy holds: every write committed at or before
  // this LMDB txnid is in the generation.
  uint64_t txnid = 0;
  int64_t published_us = 0;  // the publisher's wall clock; informational, never compared
  uint64_t data_bytes = 0;
  Hash128 data_hash;   // xxh3-128 of catalog/data.mdb
  uint64_t epoch = 0;  // the writer epoch of the publisher (0: written before fencing existed)
};

// `<store_dir>/replica`.
std::string ReplicaRootFor(const std::string& store_dir);
// "gen-" followed by the generation as 20 decimal digits (names sort in generation order).
std::string GenerationDirName(uint64_t generation);

// Reads and checks `<replica_root>/<GenerationDirName(gen)>/MANIFEST.json`.
[[nodiscard]] absl::StatusOr<GenerationManifest> ReadManifest(const std::string& replica_root,
                                                              uint64_t generation);
// The generation CURRENT names; NotFound before the first publish.
[[nodiscard]] absl::StatusOr<uint64_t> ReadCurrentGeneration(const std::string& replica_root);
// The highest writer epoch taken in `replica_root` (0 when none).
[[nodiscard]] absl::StatusOr<uint64_t> ReadWriterEpoch(const std::string& replica_root);

struct PublisherOptions {
  // Generations kept on disk (the newest `keep`); older ones are removed after each publish.
  // Followers that still map a removed generation keep reading it (the file stays alive while
  // mapped). At least 2.
  uint64_t keep = 8;
  // Take the exclusive flock on LOCK. false: for a replica root on a file system where flock is
  // not trusted (or to take over from a writer believed dead): the writer epoch alone fences
  // the previous publisher.
  bool use_flock = true;
};

// Publishes generations of one catalog. One per replica root: Open takes an exclusive flock on
// `<replica_root>/LOCK` for the publisher's life (released by the kernel if the process dies).
// Not thread-safe: one thread publishes.
class ReplicaPublisher {
 public:
  // Takes the lock (FailedPrecondition when another publisher holds it) and a new writer
  // epoch (fencing every earlier publisher), removes leftover `tmp-*` directories of a
  // publisher that died mid-publish, and continues numbering after the newest generation on
  // disk. InvalidArgument for keep < 2.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ReplicaPublisher>> Open(
      std::shared_ptr<Catalog> catalog, const std::string& replica_root,
      const PublisherOptions& options = {});
  ~ReplicaPublisher();
  ReplicaPublisher(const ReplicaPublisher&) = delete;
  ReplicaPublisher& operator=(const ReplicaPublisher&) = delete;

  // Publishes a new generation from the catalog as it is now and points CURRENT at it. On error
  // nothing a follower reads has changed (the temp directory is removed). FailedPrecondition
  // ("fenced") when a newer writer epoch exists: this publisher must stop.
  [[nodiscard]] absl::StatusOr<GenerationManifest> Publish();
  // Publishes only when a write was committed after the newest generation's txnid (the first
  // call always publishes). nullopt when nothing changed.
  [[nodiscard]] absl::StatusOr<std::optional<GenerationManifest>> PublishIfChanged();

  const std::string& replica_root() const { return root_; }
  // The newest generation on disk (0 before the first).
  uint64_t last_generation() const { return last_gen_; }
  // This publisher's writer epoch (taken at Open).
  uint64_t epoch() const { return epoch_; }

 private:
  ReplicaPublisher(std::shared_ptr<Catalog> catalog, std::string root, PublisherOptions options,
                   int lock_fd);
  [[nodiscard]] absl::Status Prune();
  // FailedPrecondition when a writer epoch newer than ours was taken.
  [[nodiscard]] absl::Status CheckNotFenced() const;

  std::shared_ptr<Catalog> catalog_;
  std::string root_;
  PublisherOptions options_;
  int lock_fd_ = -1;
  uint64_t last_gen_ = 0;
  uint64_t epoch_ = 0;
  std::optional<uint64_t> last_txnid_;  // of the last generation this publisher wrote
};

struct FollowerOptions {
  // Where blob files live (the shared blob root). Default: `<replica_root>/../blobs`, the
  // writer store's own blob directory.
  std::string blob_root;
};

// An engine's read-only view of the catalog: the newest verified generation, swapped
// atomically on Refresh(). Thread-safe: readers take `store()` (a shared_ptr that keeps the
// generation they use open across a swap) while one thread refreshes.
class ReplicaFollower {
 public:
  // Opens the generation CURRENT names. NotFound before the first publish.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ReplicaFollower>> Open(
      const std::string& replica_root, const FollowerOptions& options = {});

  // When CURRENT names a newer generation than the one held: verifies its manifest (same store
  // id as the first generation opened, data size and xxh3-128, a writer epoch not lower than
  // the held one's), opens it read-only and swaps. Returns true when it swapped. On any error
  // the held generation stays in use (FailedPrecondition for a fenced writer's generation).
  [[nodiscard]] absl::StatusOr<bool> Refresh();

  // The held generation's store (read-only: writes fail with FailedPrecondition).
  std::shared_ptr<Store> store() const ABSL_LOCKS_EXCLUDED(mu_);
  GenerationManifest manifest() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& replica_root() const { return root_; }
  const std::string& blob_root() const { return blob_root_; }

 private:
  ReplicaFollower(std::string root, std::string blob_root);
  // Verifies and opens generation `gen`.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Store>> OpenGeneration(
      uint64_t gen, GenerationManifest* manifest) const;

  std::string root_;
  std::string blob_root_;
  // loradb::Mutex, not absl::Mutex: visible to ThreadSanitizer (storage/util/mutex.h).
  Mutex refresh_mu_;  // one Refresh at a time
  mutable Mutex mu_;
  std::shared_ptr<Store> store_ ABSL_GUARDED_BY(mu_);
  GenerationManifest manifest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loradb

#endif  // LORADB_STORAGE_REPLICATION_REPLICATION_H_
