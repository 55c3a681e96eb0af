// Catalog records <-> FlatBuffers bytes (schema/catalog.fbs). Internal to storage/catalog.
// Decoders verify the buffer and reject records whose layout version is newer than this build.
#ifndef LORADB_STORAGE_CATALOG_CODEC_H_
#define LORADB_STORAGE_CATALOG_CODEC_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/catalog/records.h"

namespace loradb::catalog_codec {

std::string EncodeBase(const BaseRecord& r);
// Policy records as schema v7 writes them: `r.id` is the key and is not stored.
std::string EncodePolicy(const PolicyRecord& r);
// The same record with its id, as schema v1-v6 stores hold it (for the writers of old-version
// stores that migration tests start from).
std::string EncodePolicyWithId(const PolicyRecord& r);
// Revision records in the layout this build writes (4): `r.id` is the key and is not stored, and
// `r.base` is left out when it equals `policy_base`, the base of the revision's policy.
std::string EncodeRevision(const RevisionRecord& r, absl::string_view policy_base);
// The same record in layout 3 (base always stored, absent when empty), as schema v6 stores hold
// it.
std::string EncodeRevisionLayout3(const RevisionRecord& r);
// The same record in layout 2 (id not stored), as schema v4-v5 stores hold it (for migrations
// to those versions and the writers of old-version stores that tests start from).
std::string EncodeRevisionLayout2(const RevisionRecord& r);
// The same record in layout 1 (id stored), as schema v1-v3 stores hold it (for the writers of
// old-version stores that migration tests start from).
std::string EncodeRevisionLayout1(const RevisionRecord& r);
// Alias log entries as schema v5 writes them: the reasons "publish", "set" and "rollback" as one
// byte (reason_kind), any other as its string.
std::string EncodeAliasLogEntry(const AliasLogEntry& r);
// The same entry with the reason always as a string, as schema v1-v4 stores hold it.
std::string EncodeAliasLogEntryLayout1(const AliasLogEntry& r);
std::string EncodeCheckpoint(const CheckpointRecord& r);
std::string EncodeBlob(const BlobRecord& r);

using Bytes = std::span<const uint8_t>;
[[nodiscard]] absl::StatusOr<BaseRecord> DecodeBase(Bytes b);
// `key_id` is the record's key: the policy's id (v7 records do not store it).
[[nodiscard]] absl::StatusOr<PolicyRecord> DecodePolicy(Bytes b, uint64_t key_id);
// The base of the policy with id `policy_id` (NotFound when there is none), for a layout-4
// revision record that leaves its base to its policy.
using PolicyBaseFn = absl::FunctionRef<absl::StatusOr<std::string>(uint64_t policy_id)>;
// Any layout; `key_id` is the record's key (the id of a layout-2, -3 or -4 record). A layout-4
// record without a base takes `policy_base(policy id)`, whose error is returned.
[[nodiscard]] absl::StatusOr<RevisionRecord> DecodeRevision(Bytes b, uint64_t key_id,
                                                            PolicyBaseFn policy_base);
// The same for records that store their base (layouts 1-3, and layout 4 where the base is not
// the policy's); FailedPrecondition for a layout-4 record that leaves its base to its policy.
[[nodiscard]] absl::StatusOr<RevisionRecord> DecodeRevision(Bytes b, uint64_t key_id);
// The state field only (for scans that skip deleted revisions without decoding).
[[nodiscard]] absl::StatusOr<RevisionState> DecodeRevisionState(Bytes b);
// `alias` is not stored in the value (it is part of the key); the result leaves it empty.
[[nodiscard]] absl::StatusOr<AliasLogEntry> DecodeAliasLogEntry(Bytes b);
[[nodiscard]] absl::StatusOr<CheckpointRecord> DecodeCheckpoint(Bytes b);
// `hash` is part of the key; the result leaves it zero.
[[nodiscard]] absl::StatusOr<BlobRecord> DecodeBlob(Bytes b);

}  // namespace loradb::catalog_codec

#endif  // LORADB_STORAGE_CATALOG_CODEC_H_
