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
const fb::Revision* Rev(const void* table) { return static_cast<const fb::Revision*>(table); }
const fb::Policy* Pol(const void* table) { return static_cast<const fb::Policy*>(table); }
}  // namespace

uint64_t RevisionView::id() const { return Rev(checked_table())->id(); }
uint64_t RevisionView::policy_id() const { return Rev(checked_table())->policy_id(); }
uint64_t RevisionView::seq() const { return Rev(checked_table())->seq(); }
absl::string_view RevisionView::base() const { return StrView(Rev(checked_table())->base()); }
uint64_t RevisionView::parent() const { return Rev(checked_table())->parent(); }

SourceKind RevisionView::source_kind() const {
  const fb::Source* s = Rev(checked_table())->source();
  return s == nullptr ? SourceKind::kImported : static_cast<SourceKind>(s->kind());
}

uint64_t RevisionView::source_checkpoint_id() const {
  const fb::Source* s = Rev(checked_table())->source();
  return s == nullptr ? 0 : s->checkpoint_id();
}

int32_t RevisionView::lora_r() const {
  const fb::LoraConfig* l = Rev(checked_table())->lora();
  return l == nullptr ? 0 : l->r();
}

float RevisionView::lora_alpha() const {
  const fb::LoraConfig* l = Rev(checked_table())->lora();
  return l == nullptr ? 0.0f : l->alpha();
}

absl::string_view RevisionView::dtype() const { return StrView(Rev(checked_table())->dtype()); }
Layout RevisionView::layout() const { return static_cast<Layout>(Rev(checked_table())->layout()); }
BlobRef RevisionView::blob() const { return catalog_codec::BlobRefFromTable(Rev(checked_table())->blob()); }
int64_t RevisionView::created_us() const { return Rev(checked_table())->created_us(); }

RevisionState RevisionView::state() const {
  return static_cast<RevisionState>(Rev(checked_table())->state());
}

RevisionRecord RevisionView::ToRecord() const {
  return catalog_codec::RevisionFromTable(*Rev(checked_table()));
}

// ---- PolicyView

const void* PolicyView::checked_table() const {
  if (table_ == nullptr) DieStale("empty PolicyView");
  CheckSlot(slot_, epoch_, "PolicyView");
  return table_;
}

uint64_t PolicyView::id() const { return Pol(checked_table())->id(); }
absl::string_view PolicyView::name() const { return StrView(Pol(checked_table())->name()); }
absl::string_view PolicyView::base() const { return StrView(Pol(checked_table())->base()); }
bool PolicyView::archived() const { return Pol(checked_table())->archived(); }
int64_t PolicyView::created_us() const { return Pol(checked_table())->created_us(); }

}  // namespace loradb
