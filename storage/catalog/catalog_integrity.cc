// Catalog::CheckIntegrity: every cross-reference of the catalog checked in one read transaction.
#include <lmdb.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/codec.h"
#include "storage/catalog/lmdb_txn.h"
#include "storage/util/status_macros.h"

namespace loradb {

namespace codec = catalog_codec;
using catalog_lmdb::Cursor;
using catalog_lmdb::GetBE64;
using catalog_lmdb::ResolveNextSeq;
using catalog_lmdb::ValBytes;

absl::StatusOr<CatalogIntegrity> Catalog::CheckIntegrity() const {
  CatalogIntegrity out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    out = CatalogIntegrity{};
    auto problem = [&](std::string p) {
      if (out.problems.size() < 1000) out.problems.push_back(std::move(p));
    };
    MDB_val k, v;
    // Bases.
    std::set<std::string, std::less<>> bases;
    {
      Cursor c(txn, dbi_->bases);
      LORADB_RETURN_IF_ERROR(c.status());
      for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
        bases.emplace(static_cast<const char*>(k.mv_data), k.mv_size);
      }
    }
    // Policies, both directions.
    std::map<uint64_t, PolicyRecord> policies;
    {
      Cursor c(txn, dbi_->policy_by_id);
      LORADB_RETURN_IF_ERROR(c.status());
      for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
        if (k.mv_size != 8) {
          problem(absl::StrCat("policy record key of ", k.mv_size, " bytes is not an id"));
          continue;
        }
        auto p = codec::DecodePolicy(ValBytes(v), GetBE64(k.mv_data));
        if (!p.ok()) {
          problem(std::string(p.status().message()));
          continue;
        }
        if (!bases.contains(p->base)) {
          problem(absl::StrCat("policy '", p->name, "' names missing base '", p->base, "'"));
        }
        LORADB_RETURN_IF_ERROR(ResolveNextSeq(txn, *dbi_, &*p));
        policies[p->id] = std::move(*p);
      }
    }
    {
      Cursor c(txn, dbi_->policies);
      LORADB_RETURN_IF_ERROR(c.status());
      size_t names = 0;
      for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
        ++names;
        const char* name_data = nullptr;
        size_t name_size = 0;
        if (!catalog_keys::GetPolicyNameKey(k.mv_data, k.mv_size, &name_data, &name_size)) {
          problem(absl::StrCat("policy name key of ", k.mv_size,
                               " bytes does not start with its length"));
          continue;
        }
        const std::string name(name_data, name_size);
        auto it = v.mv_size == 8 ? policies.find(GetBE64(v.mv_data)) : policies.end();
        if (it == policies.end() || it->second.name != name) {
          problem(absl::StrCat("policy name '", name, "' maps to a missing or different policy"));
        }
      }
      if (names != policies.size()) {
        problem(absl::StrCat(policies.size(), " policy records but ", names, " policy names"));
      }
    }
    out.policies = policies.size();
    // Blob references: live revisions and checkpoints.
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> refs;
    auto add_ref = [&](const BlobRef& b) {
      if (!b.empty()) ++refs[{b.hash.high, b.hash.low}];
    };
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> rev_policy_seq;  // id -> (policy, seq)
    std::map<uint64_t, bool> live;
    {
      Cursor c(txn, dbi_->revisions);
      LORADB_RETURN_IF_ERROR(c.status());
      // Views: each record is verified and read in place, nothing is decoded or allocated.
      for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
        ++out.revisions;
        CatalogViewScope scope(txn, dbi_.get());
        const uint64_t key_id = k.mv_size == 8 ? GetBE64(k.mv_data) : 0;
        auto r = catalog_lmdb::ViewRevisionBytes(ValBytes(v), key_id, scope);
        if (!r.ok()) {
          problem(std::string(r.status().message()));
          continue;
        }
        const uint64_t id = r->id();
        if (k.mv_size != 8 || GetBE64(k.mv_data) != id) {
          problem(absl::StrCat("revision ", id, " is stored under another key"));
        }
        auto pit = policies.find(r->policy_id());
        if (pit == policies.end()) {
          problem(absl::StrCat("revision ", id, " names missing policy id ", r->policy_id()));
        } else if (r->seq() == 0 || r->seq() >= pit->second.next_seq) {
          problem(absl::StrCat("revision ", id, " has seq ", r->seq(), " outside policy '",
                               pit->second.name, "' (next seq ", pit->second.next_seq, ")"));
        }
        if (!bases.contains(r->base())) {
          problem(absl::StrCat("revision ", id, " names missing base '", r->base(), "'"));
        }
        rev_policy_seq[id] = {r->policy_id(), r->seq()};
        live[id] = r->live();
        if (r->live()) {
          ++out.live_revisions;
          add_ref(r->blob());
        }
      }
    }
    // The policy -> revisions index must match the revisions exactly.
    {
      Cursor c(txn, dbi_->policy_revisions);
      LORADB_RETURN_IF_ERROR(c.status());
      uint64_t entries = 0;
      for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
        ++entries;
        const uint64_t pid = GetBE64(k.mv_data);
        const uint64_t seq = GetBE64(v.mv_data);
        const uint64_t id = GetBE64(static_cast<const uint8_t*>(v.mv_data) + 8);
        auto it = rev_policy_seq.find(id);
        if (it == rev_policy_seq.end() || it->second != std::make_pair(pid, seq)) {
          problem(absl::StrCat("index entry (policy ", pid, ", seq ", seq, ") -> revision ", id,
                               " does not match a revision"));
        }
      }
      if (entries != out.revisions) {
        problem(absl::StrCat(out.revisions, " revisions but ", entries, " index entries"));
      }
    }
    // Aliases: each alias's value is the `to` of its last log entry; the log's chain and
    // numbering are checked by verify (storage/maintenance).
    {
      Cursor c(txn, dbi_->alias_log);
      LORADB_RETURN_IF_ERROR(c.status());
      int rc = c.Get(&k, &v, MDB_FIRST);
      while (rc == 0) {
        const auto* key = static_cast<const uint8_t*>(k.mv_data);
        if (!catalog_keys::IsAliasLogKey(k.mv_data, k.mv_size)) {
          problem(absl::StrCat("alias log key of ", k.mv_size,
                               " bytes does not hold its alias's length"));
          rc = c.Get(&k, &v, MDB_NEXT);
          continue;
        }
        ++out.aliases;
        const uint64_t pid = GetBE64(key);
        const std::string alias(reinterpret_cast<const char*>(key) + 9, key[8]);
        catalog_lmdb::AliasLogKey alias_key(pid, alias);
        rc = catalog_lmdb::SeekLastAliasLogEntry(c.get(), alias_key, &k, &v);
        if (rc != 0) break;
        auto id = catalog_lmdb::AliasLogEntryTo(v);
        if (!id.ok()) {
          problem(
              absl::StrCat("alias '", alias, "' of policy id ", pid, ": ", id.status().message()));
        } else {
          auto it = rev_policy_seq.find(*id);
          if (it == rev_policy_seq.end() || it->second.first != pid || !live[*id]) {
            problem(absl::StrCat("alias '", alias, "' of policy id ", pid,
                                 " points at missing, deleted or foreign revision ", *id));
          }
        }
        rc = c.Get(&k, &v, MDB_NEXT);
      }
      if (rc != MDB_NOTFOUND) return catalog_lmdb::LmdbError(rc, "alias log");
    }
    // Checkpoints.
    {
      Cursor c(txn, dbi_->checkpoints);
      LORADB_RETURN_IF_ERROR(c.status());
      for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
        ++out.checkpoints;
        auto ck = codec::DecodeCheckpoint(ValBytes(v));
        if (!ck.ok()) {
          problem(std::string(ck.status().message()));
          continue;
        }
        if (!policies.count(ck->policy_id)) {
          problem(absl::StrCat("checkpoint ", ck->id, " names missing policy id ", ck->policy_id));
        }
        for (const BlobRef* b : {&ck->master, &ck->optimizer, &ck->gradients, &ck->rollout}) {
          add_ref(*b);
        }
      }
    }
    // Blob records against counted references.
    {
      Cursor c(txn, dbi_->blobs);
      LORADB_RETURN_IF_ERROR(c.status());
      for (int rc = c.Get(&k, &v, MDB_FIRST); rc == 0; rc = c.Get(&k, &v, MDB_NEXT)) {
        auto b = codec::DecodeBlob(ValBytes(v));
        if (!b.ok() || k.mv_size != 16) {
          problem("corrupt blob record");
          continue;
        }
        b->hash = Hash128{GetBE64(k.mv_data), GetBE64(static_cast<const uint8_t*>(k.mv_data) + 8)};
        auto it = refs.find({b->hash.high, b->hash.low});
        const uint64_t counted = it == refs.end() ? 0 : it->second;
        if (counted != b->refcount) {
          problem(absl::StrCat("blob ", b->hash.Hex(), " has refcount ", b->refcount, " but ",
                               counted, " references"));
        }
        if (it != refs.end()) refs.erase(it);
        out.blobs.push_back(std::move(*b));
      }
      for (const auto& [h, n] : refs) {
        problem(absl::StrCat("blob ", Hash128{h.first, h.second}.Hex(), " is referenced ", n,
                             " times but has no record"));
      }
    }
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace loradb
