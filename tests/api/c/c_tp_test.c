/* Tests of the C API's tensor-parallel tier options, compiled as C11: loradb_options_set_tp
 * (validation with a message naming the field, a refused call changes nothing), a TP-placed
 * device tier holding only the rank's shard (exact values), the slot bytes and placement in
 * loradb_locate and loradb_stats, derived per-rank blobs removed when their revision is deleted,
 * the pool bytes inside the CPU budget, and the version-1 sizes of the grown structs. */
#define _XOPEN_SOURCE 700
#include <dirent.h>

#include "c_test_util.h"

static loradb_tp_options_t tp_init(uint32_t rank, uint32_t degree) {
  loradb_tp_options_t t;
  memset(&t, 0, sizeof(t));
  t.struct_size = sizeof(t);
  t.rank = rank;
  t.degree = degree;
  t.cuda_device = -1;
  return t;
}

/* Calls loradb_options_set_tp expecting `code` and, for an error, a message containing `part`. */
static void expect_tp(loradb_options_t* o, const loradb_tp_options_t* t, loradb_status_t code,
                      const char* part) {
  char* err = NULL;
  CHECK_CODE(loradb_options_set_tp(o, t, &err), code);
  if (code == LORADB_OK) {
    CHECK(err == NULL);
  } else {
    CHECK(err != NULL && strstr(err, part) != NULL);
    if (err != NULL && strstr(err, part) == NULL) fprintf(stderr, "  message: %s\n", err);
  }
  loradb_free(err);
}

/* Opens <tmp>/store with `o`, base "tiny" and policy "team/a". */
static loradb_store_t* open_store(const loradb_options_t* o) {
  char path[512];
  loradb_store_t* store = NULL;
  char* err = NULL;
  path_in_tmp("store", path, sizeof(path));
  CHECK_CODE(loradb_open(path, strlen(path), o, &store, &err), LORADB_OK);
  if (err != NULL) {
    fprintf(stderr, "  open: %s\n", err);
    loradb_free(err);
  }
  if (store == NULL) return NULL;
  CHECK_CODE(loradb_base_add_modules(store, S("tiny"), S(kModules), NULL), LORADB_OK);
  CHECK_CODE(loradb_policy_create(store, S("team/a"), S("tiny"), NULL, 0, NULL, NULL), LORADB_OK);
  return store;
}

/* Regular files under `dir`/tp2 whose name ends in ".blob". */
static int derived_files(const char* dir) {
  char path[600];
  DIR* d;
  struct dirent* e;
  int n = 0;
  snprintf(path, sizeof(path), "%s/tp2", dir);
  d = opendir(path);
  if (d == NULL) return 0;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len > 5 && strcmp(e->d_name + len - 5, ".blob") == 0) ++n;
  }
  closedir(d);
  return n;
}

static void test_set_tp_validation(void) {
  loradb_options_t *o = NULL, *stale;
  loradb_tp_options_t t = tp_init(0, 2);
  loradb_store_t* store;
  loradb_stats_t st;
  char* err = NULL;
  CHECK_CODE(loradb_options_set_tp(NULL, &t, &err), LORADB_INVALID_ARGUMENT);
  loradb_free(err);
  CHECK_CODE(loradb_options_create(&o), LORADB_OK);
  expect_tp(o, &t, LORADB_OK, "");
  t = tp_init(1, 2); /* the placement the refused calls below must leave alone */
  expect_tp(o, &t, LORADB_OK, "");

  t.struct_size = sizeof(t) - 1;
  expect_tp(o, &t, LORADB_INVALID_ARGUMENT, "struct_size");
  t = tp_init(0, 0);
  expect_tp(o, &t, LORADB_INVALID_ARGUMENT, "degree");
  t = tp_init(0, 5000);
  expect_tp(o, &t, LORADB_INVALID_ARGUMENT, "degree");
  t = tp_init(2, 2);
  expect_tp(o, &t, LORADB_INVALID_ARGUMENT, "rank");
  t = tp_init(0, 2);
  t.cuda_device = -2;
  expect_tp(o, &t, LORADB_INVALID_ARGUMENT, "cuda_device");
  t = tp_init(0, 2);
  t.derived_dir = NULL;
  t.derived_dir_len = 4;
  expect_tp(o, &t, LORADB_INVALID_ARGUMENT, "derived_dir");
  t = tp_init(0, 2);
  t.derived_dir = "a\0b";
  t.derived_dir_len = 3;
  expect_tp(o, &t, LORADB_INVALID_ARGUMENT, "NUL");
  t = tp_init(0, 1);
  t.derived_dir = "/tmp/x";
  t.derived_dir_len = 6;
  expect_tp(o, &t, LORADB_INVALID_ARGUMENT, "degree > 1");

  /* Nothing changed: the store opens at rank 1 of 2. */
  store = open_store(o);
  if (store != NULL) {
    memset(&st, 0, sizeof(st));
    st.struct_size = sizeof(st);
    CHECK_CODE(loradb_stats(store, &st, NULL), LORADB_OK);
    CHECK(st.tp_rank == 1 && st.tp_degree == 2 && st.tp_derived == 0);
    CHECK_CODE(loradb_close(&store), LORADB_OK);
  }
  /* NULL resets to no placement. */
  CHECK_CODE(loradb_options_set_tp(o, NULL, NULL), LORADB_OK);
  stale = o;
  CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
  t = tp_init(0, 2);
  err = NULL;
  CHECK_CODE(loradb_options_set_tp(stale, &t, &err), LORADB_INVALID_HANDLE);
  loradb_free(err);
}

static void test_tp_placed_tiers(void) {
  char derived[512];
  loradb_options_t* o = NULL;
  loradb_tp_options_t t = tp_init(1, 2);
  loradb_store_t* store;
  loradb_batch_lease_t* batch = NULL;
  loradb_batch_adapter_t a;
  loradb_tensor_view_t v;
  loradb_located_t l;
  loradb_stats_t st;
  uint64_t id, keep;
  size_t i;
  path_in_tmp("derived", derived, sizeof(derived));
  CHECK_CODE(loradb_options_create(&o), LORADB_OK);
  CHECK_CODE(loradb_options_set_device(o, LORADB_DEVICE_HOST, 1 << 20, 256), LORADB_OK);
  t.derived_dir = derived;
  t.derived_dir_len = strlen(derived);
  expect_tp(o, &t, LORADB_OK, "");
  store = open_store(o);
  CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
  if (store == NULL) return;
  keep = publish(store, 9.0f, "serving");
  id = publish(store, 3.0f, NULL); /* "latest" */

  CHECK_CODE(loradb_acquire_batch(store, &id, 1, &batch, NULL, NULL), LORADB_OK);
  if (batch == NULL) return;
  memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  CHECK_CODE(loradb_batch_adapter(batch, 0, &a), LORADB_OK);
  /* Rank 1 of 2: A factors whole (2x8 floats each), q_proj B rows 8..15 (8x2), k_proj B rows
   * 2..3 (2x2). (a.bytes counts each tensor's arena alignment too.) */
  CHECK(a.tensor_count == 4 && a.bytes > 0);
  memset(&v, 0, sizeof(v));
  v.struct_size = sizeof(v);
  CHECK_CODE(loradb_batch_tensor_find(
                 batch, 0, S("base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"), &v),
             LORADB_OK);
  CHECK(v.ndim == 2 && v.shape[0] == 2 && v.shape[1] == 2 && v.nbytes == 4 * sizeof(float));
  memset(&v, 0, sizeof(v));
  v.struct_size = sizeof(v);
  CHECK_CODE(loradb_batch_tensor_find(
                 batch, 0, S("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), &v),
             LORADB_OK);
  CHECK(v.ndim == 2 && v.shape[0] == 2 && v.shape[1] == 8); /* replicated: whole */
  memset(&v, 0, sizeof(v));
  v.struct_size = sizeof(v);
  CHECK_CODE(loradb_batch_tensor_find(
                 batch, 0, S("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"), &v),
             LORADB_OK);
  CHECK(v.ndim == 2 && v.shape[0] == 8 && v.shape[1] == 2);
  if (v.data != NULL && v.nbytes == 16 * sizeof(float)) {
    const float* f = (const float*)v.data;
    for (i = 0; i < 16; ++i) CHECK(f[i] == 3.0f - (float)(16 + i)); /* make_adapter's b_q */
  }
  CHECK(derived_files(derived) == 1); /* the CPU tier holds the rank's derived blob */

  memset(&l, 0, sizeof(l));
  l.struct_size = sizeof(l);
  CHECK_CODE(loradb_locate(store, S("team/a"), S("latest"), &l, NULL), LORADB_OK);
  CHECK(l.revision_id == id && l.tier == LORADB_TIER_GPU && l.has_slot == 1);
  CHECK(l.device_bytes == a.bytes && l.tp_rank == 1 && l.tp_degree == 2);
  loradb_free(l.base_name);
  loradb_free(l.blob_path);

  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  CHECK_CODE(loradb_stats(store, &st, NULL), LORADB_OK);
  CHECK(st.tp_rank == 1 && st.tp_degree == 2 && st.tp_derived == 1);
  CHECK(st.cpu_pool_cap_bytes <= st.cpu_budget_bytes);
  CHECK(st.cpu_resident_bytes + st.cpu_pooled_bytes <= st.cpu_budget_bytes);
  CHECK_CODE(loradb_batch_release(&batch), LORADB_OK);

  /* Deleting the revision removes its derived blob; the other revision's stays. */
  CHECK_CODE(loradb_acquire_batch(store, &keep, 1, &batch, NULL, NULL), LORADB_OK);
  CHECK_CODE(loradb_batch_release(&batch), LORADB_OK);
  CHECK(derived_files(derived) == 2);
  CHECK_CODE(loradb_revision_delete(store, id, NULL), LORADB_OK);
  CHECK(derived_files(derived) == 1);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void test_placement_that_does_not_divide(void) {
  loradb_options_t* o = NULL;
  loradb_tp_options_t t = tp_init(0, 3);
  loradb_store_t* store;
  loradb_batch_lease_t* batch = NULL;
  uint64_t id;
  char* err = NULL;
  CHECK_CODE(loradb_options_create(&o), LORADB_OK);
  CHECK_CODE(loradb_options_set_device(o, LORADB_DEVICE_HOST, 1 << 20, 256), LORADB_OK);
  expect_tp(o, &t, LORADB_OK, "");
  store = open_store(o);
  CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
  if (store == NULL) return;
  id = publish(store, 1.0f, NULL);
  /* q_proj B has 16 rows: not divisible by 3. */
  CHECK_CODE(loradb_acquire_batch(store, &id, 1, &batch, NULL, &err), LORADB_INVALID_ARGUMENT);
  CHECK(batch == NULL);
  CHECK(err != NULL && strstr(err, "divisible") != NULL);
  if (err != NULL) fprintf(stderr, "  (expected) %s\n", err);
  loradb_free(err);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void test_version1_struct_sizes(void) {
  loradb_store_t* store = open_fixture();
  loradb_located_t l;
  loradb_stats_t st;
  const unsigned char* tail;
  size_t i;
  int untouched = 1;
  if (store == NULL) return;
  (void)publish(store, 2.0f, "serving");
  /* A caller built against the version-1 header: only its bytes are written. */
  memset(&l, 0xab, sizeof(l));
  l.struct_size = LORADB_LOCATED_V1_SIZE;
  CHECK_CODE(loradb_locate(store, S("team/a"), S("serving"), &l, NULL), LORADB_OK);
  CHECK(l.revision_id != 0 && l.base_name != NULL && strcmp(l.base_name, "tiny") == 0);
  tail = (const unsigned char*)&l + LORADB_LOCATED_V1_SIZE;
  for (i = 0; i < sizeof(l) - LORADB_LOCATED_V1_SIZE; ++i) untouched = untouched && tail[i] == 0xab;
  CHECK(untouched);
  loradb_free(l.base_name);
  loradb_free(l.blob_path);
  l.struct_size = LORADB_LOCATED_V1_SIZE + 8;
  CHECK_CODE(loradb_locate(store, S("team/a"), S("serving"), &l, NULL), LORADB_INVALID_ARGUMENT);

  memset(&st, 0xab, sizeof(st));
  st.struct_size = LORADB_STATS_V1_SIZE;
  CHECK_CODE(loradb_stats(store, &st, NULL), LORADB_OK);
  CHECK(st.tiers == 1 && st.cpu_budget_bytes > 0);
  tail = (const unsigned char*)&st + LORADB_STATS_V1_SIZE;
  untouched = 1;
  for (i = 0; i < sizeof(st) - LORADB_STATS_V1_SIZE; ++i) untouched = untouched && tail[i] == 0xab;
  CHECK(untouched);
  st.struct_size = sizeof(st);
  CHECK_CODE(loradb_stats(store, &st, NULL), LORADB_OK);
  CHECK(st.tp_rank == 0 && st.tp_degree == 1 && st.tp_derived == 0);
  st.struct_size = LORADB_STATS_V1_SIZE - 8;
  CHECK_CODE(loradb_stats(store, &st, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void run_fresh(const char* name, void (*fn)(void)) {
  make_tmp();
  run_test(name, fn);
  remove_tmp();
}

int main(void) {
  run_fresh("set_tp_validation", test_set_tp_validation);
  run_fresh("tp_placed_tiers", test_tp_placed_tiers);
  run_fresh("placement_that_does_not_divide", test_placement_that_does_not_divide);
  run_fresh("version1_struct_sizes", test_version1_struct_sizes);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
