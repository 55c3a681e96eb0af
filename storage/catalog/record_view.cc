// RevisionView and PolicyView accessors: each checks that the view's transaction is still the
// one it was made in, then reads the verified FlatBuffers table in place.
#include <cstdio>
#include <cstdlib>

#include "storage/catalog/catalog.h"
#include "storage/catalog/codec_tables.h"
#include "storage/catalog/lmdb_txn.h"

namespace loradb {
namespace {

namespace fb = catalog_codec::fb;

[[noreturn]] void DieStale(const char* what) {
  std::fprintf(stderr,
               "catalog: a %s was used after its read transaction ended (a view is valid only "
               "inside the Catalog::Read callback that made it; keep an owning record instead)\n",
               what);
  std::abort();
}

inline void CheckSlot(const CatalogReadSlot* slot, uint64_t epoch, const char* what) {
  if (slot != nullptr && slot->epoch.load(std::memory_order_acquire) != epoch) DieStale(what);
}

absl::string_view StrView(const flatbuffers::String* s) {
  return s == nullptr ? absl::string_view() : absl::string_view(s->data(), s->size());
}

}  // namespace

// ---- RevisionView

const void* RevisionView::checked_table() const {
  if (table_ == nullptr) DieStale("empty RevisionView");
  CheckSlot(slot_, epoch_, "RevisionView");
  return table_;
}

namespace {
const fb::Revision* V1(const void* table) { return static_cast<const fb::Revision*>(table); }
const fb::RevisionV2* V2(const void* table) { return static_cast<const fb::RevisionV2*>(table); }
const fb::RevisionV3* V3(const void* table) { return static_cast<const fb::RevisionV3*>(table); }
const fb::Policy* Pol(const void* table) { return static_cast<const fb::Policy*>(table); }
}  // namespace

// Layouts 3 and 2 keep the scalars in their fixed structs (present: checked at verification),
// under the same names; layout 1 keeps them as table fields and subtables.
#define LORADB_REVISION_FIELD(fixed_expr, v1_expr) \
  const void* t = checked_table();                 \
  if (layout_ == 3) {                              \
    const fb::RevisionFixed3& f = *V3(t)->fixed(); \
    return fixed_expr;                             \
  }                                                \
  if (layout_ == 2) {                              \
    const fb::RevisionFixed& f = *V2(t)->fixed();  \
    return fixed_expr;                             \
  }                                                \
  const fb::Revision* r = V1(t);                   \
  return v1_expr

uint64_t RevisionView::id() const {
  checked_table();
  return id_;
}
uint64_t RevisionView::policy_id() const { LORADB_REVISION_FIELD(f.policy_id(), r->policy_id()); }
uint64_t RevisionView::seq() const { LORADB_REVISION_FIELD(f.seq(), r->seq()); }
absl::string_view RevisionView::base() const {
  const void* t = checked_table();
  if (layout_ == 3) {
    const fb::RevisionV3* r = V3(t);
    catalog_codec::RevisionTables tables;
    tables.v3 = r;
    if (!catalog_codec::BaseFromPolicy(tables)) return StrView(r->base());
    // Layout 4 leaves the base to the policy: its record, in this view's transaction.
    auto policy = catalog_lmdb::TxnPolicyViewById(scope_->txn, *scope_->dbi,
                                                  r->fixed()->policy_id(), *scope_);
    return policy.ok() ? policy->base() : absl::string_view();
  }
  return StrView(layout_ == 2 ? V2(t)->base() : V1(t)->base());
}
uint64_t RevisionView::parent() const { LORADB_REVISION_FIELD(f.parent(), r->parent()); }

SourceKind RevisionView::source_kind() const {
  LORADB_REVISION_FIELD(static_cast<SourceKind>(f.source_kind()),
                        r->source() == nullptr ? SourceKind::kImported
                                               : static_cast<SourceKind>(r->source()->kind()));
}

uint64_t RevisionView::source_checkpoint_id() const {
  LORADB_REVISION_FIELD(f.checkpoint_id(),
                        r->source() == nullptr ? 0 : r->source()->checkpoint_id());
}

int32_t RevisionView::lora_r() const {
  LORADB_REVISION_FIELD(f.lora_r(), r->lora() == nullptr ? 0 : r->lora()->r());
}

float RevisionView::lora_alpha() const {
  LORADB_REVISION_FIELD(f.lora_alpha(), r->lora() == nullptr ? 0.0f : r->lora()->alpha());
}

absl::string_view RevisionView::dtype() const {
  const void* t = checked_table();
  if (layout_ == 3) return catalog_codec::RevisionDtype(*V3(t));
  return StrView(layout_ == 2 ? V2(t)->dtype() : V1(t)->dtype());
}
Layout RevisionView::layout() const {
  LORADB_REVISION_FIELD(static_cast<Layout>(f.layout()), static_cast<Layout>(r->layout()));
}
BlobRef RevisionView::blob() const {
  LORADB_REVISION_FIELD((BlobRef{Hash128{f.blob_hash().high(), f.blob_hash().low()}, f.blob_bytes(),
                                 f.blob_tensors()}),
                        catalog_codec::BlobRefFromTable(r->blob()));
}
int64_t RevisionView::created_us() const { LORADB_REVISION_FIELD(f.created_us(), r->created_us()); }

RevisionState RevisionView::state() const {
  LORADB_REVISION_FIELD(static_cast<RevisionState>(f.state()),
                        static_cast<RevisionState>(r->state()));
}

#undef LORADB_REVISION_FIELD

RevisionRecord RevisionView::ToRecord() const {
  const void* t = checked_table();
  catalog_codec::RevisionTables tables;
  if (layout_ == 3) {
    tables.v3 = V3(t);
  } else if (layout_ == 2) {
    tables.v2 = V2(t);
  } else {
    tables.v1 = V1(t);
  }
  RevisionRecord r = catalog_codec::RevisionFromTables(tables, id_);
  if (catalog_codec::BaseFromPolicy(tables)) r.base = std::string(base());
  return r;
}

// ---- PolicyView

const void* PolicyView::checked_table() const {
  if (table_ == nullptr) DieStale("empty PolicyView");
  CheckSlot(slot_, epoch_, "PolicyView");
  return table_;
}

uint64_t PolicyView::id() const {
  checked_table();
  return id_;
}
absl::string_view PolicyView::name() const { return StrView(Pol(checked_table())->name()); }
absl::string_view PolicyView::base() const { return StrView(Pol(checked_table())->base()); }
bool PolicyView::archived() const { return Pol(checked_table())->archived(); }
int64_t PolicyView::created_us() const { return Pol(checked_table())->created_us(); }

}  // namespace loradb
