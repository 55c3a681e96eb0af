/* Tests of the residency part of the loradb C API, compiled as C11 (not C++): open options for
 * the tiers, CPU cache leases with tensor views, device batch leases (host backend), prefetch,
 * evict, stats, the live tier in loradb_locate, and misuse: NULL and released handles, double
 * release, close while leases are alive, wrong struct sizes, bad options, a load bound that
 * rejects with a retry-after hint, a timeout, a missing and a corrupt blob. A load is held "in
 * flight" deterministically by replacing a blob with a FIFO: the loader blocks opening it until
 * the test opens the writing end. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <time.h>

#include "c_test_util.h"

/* ---- helpers */

static loradb_options_t* make_options(loradb_device_t device, uint64_t arena, uint64_t page) {
  loradb_options_t* o = NULL;
  CHECK_CODE(loradb_options_create(&o), LORADB_OK);
  CHECK_CODE(loradb_options_set_device(o, device, arena, page), LORADB_OK);
  return o;
}

/* Opens a fresh store in <tmp>/<name> with `options`, base "tiny" and policy "team/a". */
static loradb_store_t* open_with(const char* name, const loradb_options_t* options) {
  char path[512];
  loradb_store_t* store = NULL;
  char* err = NULL;
  path_in_tmp(name, path, sizeof(path));
  CHECK_CODE(loradb_open(path, strlen(path), options, &store, &err), LORADB_OK);
  if (err != NULL) {
    fprintf(stderr, "  open: %s\n", err);
    loradb_free(err);
  }
  if (store == NULL) return NULL;
  CHECK_CODE(loradb_base_add_modules(store, S("tiny"), S(kModules), NULL), LORADB_OK);
  CHECK_CODE(loradb_policy_create(store, S("team/a"), S("tiny"), NULL, 0, NULL, NULL), LORADB_OK);
  return store;
}

static loradb_tensor_view_t view_init(void) {
  loradb_tensor_view_t v;
  memset(&v, 0, sizeof(v));
  v.struct_size = sizeof(v);
  return v;
}

static loradb_stats_t stats_of(loradb_store_t* store) {
  loradb_stats_t s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  CHECK_CODE(loradb_stats(store, &s, NULL), LORADB_OK);
  return s;
}

static loradb_located_t locate(loradb_store_t* store, const char* alias) {
  loradb_located_t l;
  memset(&l, 0, sizeof(l));
  l.struct_size = sizeof(l);
  CHECK_CODE(loradb_locate(store, S("team/a"), alias, strlen(alias), &l, NULL), LORADB_OK);
  return l;
}

static void free_located(loradb_located_t* l) {
  loradb_free(l->base_name);
  loradb_free(l->blob_path);
  l->base_name = l->blob_path = NULL;
}

/* The blob path of the revision `alias` points at (caller frees). */
static char* blob_path_of(loradb_store_t* store, const char* alias) {
  loradb_located_t l = locate(store, alias);
  loradb_free(l.base_name);
  return l.blob_path;
}

static void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

/* Replaces the file at `path` with a FIFO: a loader opening it blocks until a writer opens. */
static void blob_to_fifo(const char* path) {
  CHECK(unlink(path) == 0);
  CHECK(mkfifo(path, 0644) == 0);
}

/* Opens the FIFO's writing end once a reader (the loader, blocked in open) is there; returns
 * the fd (-1 after 20 s without a reader). */
static int open_fifo_writer(const char* path) {
  int i;
  for (i = 0; i < 20000; ++i) {
    int fd = open(path, O_WRONLY | O_NONBLOCK);
    if (fd >= 0) return fd;
    if (errno != ENXIO) break;
    sleep_ms(1);
  }
  return -1;
}

/* True when the q_proj lora_A view holds make_adapter(seed)'s values. */
static int view_matches_seed(const loradb_tensor_view_t* v, float seed) {
  const float* f = (const float*)v->data;
  size_t i;
  if (v->dtype != LORADB_DTYPE_F32 || v->ndim != 2 || v->shape[0] != 2 || v->shape[1] != 8 ||
      v->nbytes != 16 * sizeof(float) || f == NULL) {
    return 0;
  }
  for (i = 0; i < 16; ++i) {
    if (f[i] != seed + (float)i) return 0;
  }
  return 1;
}

static const char kQA[] = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";

/* ---- tests */

static void test_residency_options_misuse(void) {
  loradb_options_t* o = NULL;
  loradb_options_t* stale;
  CHECK_CODE(loradb_options_set_cpu_cache(NULL, 1 << 20, NULL, 0, 0), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_loader(NULL, LORADB_LOADER_AUTO, 1, 0, 0), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_device(NULL, LORADB_DEVICE_HOST, 1 << 20, 0),
             LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_create(&o), LORADB_OK);
  CHECK_CODE(loradb_options_set_cpu_cache(o, 1 << 20, S("belady"), 0), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_cpu_cache(o, 1 << 20, NULL, 3, 0), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_cpu_cache(o, 1 << 20, S("lru"), 0), LORADB_OK);
  CHECK_CODE(loradb_options_set_cpu_cache(o, 1 << 20, S("s3fifo"), 64), LORADB_OK);
  CHECK_CODE(loradb_options_set_cpu_cache(o, 1 << 20, S("wtinylfu"), 0), LORADB_OK);
  CHECK_CODE(loradb_options_set_loader(o, LORADB_LOADER_PREAD, 0, 4, 0), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_loader(o, (loradb_loader_t)7, 1, 4, 0), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_loader(o, LORADB_LOADER_PREAD, 1, 1000000, 0),
             LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_loader(o, LORADB_LOADER_PREAD, 2, 4, 100), LORADB_OK);
  CHECK_CODE(loradb_options_set_device(o, (loradb_device_t)9, 1 << 20, 0), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_device(o, LORADB_DEVICE_HOST, 0, 0), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_device(o, LORADB_DEVICE_HOST, 1 << 20, 300),
             LORADB_INVALID_ARGUMENT); /* not a power of two */
  CHECK_CODE(loradb_options_set_device(o, LORADB_DEVICE_HOST, 1 << 20, 128),
             LORADB_INVALID_ARGUMENT); /* below 256 */
  CHECK_CODE(loradb_options_set_device(o, LORADB_DEVICE_HOST, 4096, 8192),
             LORADB_INVALID_ARGUMENT); /* page larger than the arena */
  CHECK_CODE(loradb_options_set_device(o, LORADB_DEVICE_HOST, 1 << 20, 4096), LORADB_OK);
  CHECK_CODE(loradb_options_set_device(o, LORADB_DEVICE_NONE, 0, 0), LORADB_OK);
  stale = o;
  CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
  CHECK_CODE(loradb_options_set_cpu_cache(stale, 1 << 20, NULL, 0, 0), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_options_set_loader(stale, LORADB_LOADER_AUTO, 1, 0, 0), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_options_set_device(stale, LORADB_DEVICE_HOST, 1 << 20, 0),
             LORADB_INVALID_HANDLE);
}

static void test_without_tiers(void) {
  loradb_options_t* o = NULL;
  loradb_store_t* store;
  loradb_lease_t* lease = NULL;
  loradb_batch_lease_t* batch = NULL;
  uint64_t id;
  uint32_t retry = 7;
  loradb_stats_t st;
  loradb_located_t l;
  CHECK_CODE(loradb_options_create(&o), LORADB_OK);
  CHECK_CODE(loradb_options_set_cpu_cache(o, 0, NULL, 0, 0), LORADB_OK);
  store = open_with("store", o);
  CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
  if (store == NULL) return;
  id = publish(store, 1.0f, "canary");
  CHECK_CODE(loradb_acquire(store, id, 0, &lease, &retry, NULL), LORADB_UNAVAILABLE);
  CHECK(lease == NULL);
  CHECK(retry == 0);
  CHECK_CODE(loradb_acquire_batch(store, &id, 1, &batch, NULL, NULL), LORADB_UNAVAILABLE);
  CHECK_CODE(loradb_prefetch(store, id, NULL, NULL), LORADB_UNAVAILABLE);
  CHECK_CODE(loradb_evict(store, id, LORADB_TIER_CPU, NULL), LORADB_UNAVAILABLE);
  st = stats_of(store);
  CHECK(st.tiers == 0);
  CHECK(st.cpu_hits == 0 && st.device == LORADB_DEVICE_NONE);
  l = locate(store, "canary");
  CHECK(l.tier == LORADB_TIER_STORAGE && l.has_slot == 0);
  free_located(&l);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void test_cpu_lease_views_and_release(void) {
  loradb_store_t* store = open_with("store", NULL); /* defaults: CPU cache, no device tier */
  loradb_lease_t *lease = NULL, *second = NULL, *stale;
  loradb_tensor_view_t v = view_init();
  uint64_t r1, r2, got = 0;
  uint32_t retry = 9;
  loradb_stats_t st;
  loradb_located_t l;
  char* err = NULL;
  size_t i, n;
  if (store == NULL) return;
  r1 = publish(store, 1.0f, "canary");
  r2 = publish(store, 5.0f, "serving");
  st = stats_of(store);
  CHECK(st.tiers == 1);
  CHECK(st.device == LORADB_DEVICE_NONE);
  CHECK(strcmp(st.eviction, "wtinylfu") == 0);
  CHECK(st.loader == LORADB_LOADER_IO_URING || st.loader == LORADB_LOADER_PREAD);
  CHECK(st.cpu_budget_bytes == ((uint64_t)8 << 30));

  /* Misuse first: nothing is pinned by a refused call. */
  CHECK_CODE(loradb_acquire(NULL, r1, 0, &lease, NULL, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_acquire(store, r1, 0, NULL, NULL, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_acquire(store, 999999, 0, &lease, &retry, &err), LORADB_NOT_FOUND);
  CHECK(lease == NULL && retry == 0 && err != NULL);
  loradb_free(err);
  err = NULL;

  CHECK_CODE(loradb_acquire(store, r1, 0, &lease, &retry, &err), LORADB_OK);
  CHECK(lease != NULL && err == NULL && retry == 0);
  if (lease == NULL) return;
  CHECK_CODE(loradb_lease_revision(lease, &got), LORADB_OK);
  CHECK(got == r1);
  n = loradb_lease_tensor_count(lease);
  CHECK(n == 4);
  for (i = 0; i < n; ++i) {
    CHECK_CODE(loradb_lease_tensor_at(lease, i, &v), LORADB_OK);
    CHECK(v.name != NULL && v.name_len > 0 && v.data != NULL && v.nbytes > 0);
  }
  CHECK_CODE(loradb_lease_tensor_at(lease, n, &v), LORADB_OUT_OF_RANGE);
  CHECK_CODE(loradb_lease_tensor_find(lease, S(kQA), &v), LORADB_OK);
  CHECK(view_matches_seed(&v, 1.0f));
  CHECK(v.name_len == strlen(kQA) && memcmp(v.name, kQA, v.name_len) == 0);
  CHECK_CODE(loradb_lease_tensor_find(lease, S("nope"), &v), LORADB_NOT_FOUND);
  CHECK_CODE(loradb_lease_tensor_find(lease, NULL, 4, &v), LORADB_INVALID_ARGUMENT);
  v.struct_size = sizeof(v) - 1; /* wrong size */
  CHECK_CODE(loradb_lease_tensor_at(lease, 0, &v), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_lease_tensor_find(lease, S(kQA), &v), LORADB_INVALID_ARGUMENT);
  v.struct_size = sizeof(v);
  CHECK_CODE(loradb_lease_tensor_at(lease, 0, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_lease_revision(lease, NULL), LORADB_INVALID_ARGUMENT);

  /* The live tier: CPU with one lease. */
  l = locate(store, "canary");
  CHECK(l.tier == LORADB_TIER_CPU && l.revision_id == r1 && l.cpu_leases == 1);
  CHECK(l.has_slot == 0 && l.device_leases == 0);
  free_located(&l);
  l = locate(store, "serving");
  CHECK(l.tier == LORADB_TIER_STORAGE && l.revision_id == r2);
  free_located(&l);

  /* A second lease on the same revision is a hit; a leased entry cannot be evicted. */
  CHECK_CODE(loradb_acquire(store, r1, 1000, &second, NULL, NULL), LORADB_OK);
  CHECK_CODE(loradb_evict(store, r1, LORADB_TIER_CPU, NULL), LORADB_CONFLICT);
  st = stats_of(store);
  /* The unknown revision was a miss whose load failed. */
  CHECK(st.cpu_hits == 1 && st.cpu_misses == 2 && st.cpu_loads == 1);
  CHECK(st.cpu_load_failures == 1);
  CHECK(st.cpu_resident_entries == 1 && st.cpu_resident_bytes > 0);
  CHECK(st.cpu_leased_bytes == st.cpu_resident_bytes);
  CHECK(st.loader_files == 1 && st.loader_bytes > 0);

  /* Release, double release through a stale copy, accessors on a released lease. */
  stale = lease;
  CHECK_CODE(loradb_release(&lease), LORADB_OK);
  CHECK(lease == NULL);
  CHECK_CODE(loradb_release(&lease), LORADB_OK); /* *lease is NULL: no-op */
  CHECK_CODE(loradb_release(&stale), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_release(NULL), LORADB_INVALID_ARGUMENT);
  CHECK(loradb_lease_tensor_count(stale) == 0);
  CHECK_CODE(loradb_lease_tensor_at(stale, 0, &v), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_lease_tensor_find(stale, S(kQA), &v), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_lease_revision(stale, &got), LORADB_INVALID_HANDLE);
  /* The other lease still reads valid data. */
  CHECK_CODE(loradb_lease_tensor_find(second, S(kQA), &v), LORADB_OK);
  CHECK(view_matches_seed(&v, 1.0f));
  CHECK_CODE(loradb_release(&second), LORADB_OK);

  /* Unleased: evict works once, then it is gone. */
  CHECK_CODE(loradb_evict(store, r1, LORADB_TIER_CPU, NULL), LORADB_OK);
  CHECK_CODE(loradb_evict(store, r1, LORADB_TIER_CPU, NULL), LORADB_NOT_FOUND);
  CHECK_CODE(loradb_evict(store, r1, LORADB_TIER_STORAGE, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_evict(store, r1, (loradb_tier_t)5, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_evict(store, r1, LORADB_TIER_GPU, NULL), LORADB_UNAVAILABLE);
  l = locate(store, "canary");
  CHECK(l.tier == LORADB_TIER_STORAGE);
  free_located(&l);
  st = stats_of(store);
  CHECK(st.cpu_evictions == 1 && st.cpu_resident_entries == 0);

  /* Prefetch loads in the background; a later acquire finds it (or joins the load). */
  CHECK_CODE(loradb_prefetch(store, r2, &retry, NULL), LORADB_OK);
  CHECK_CODE(loradb_prefetch(store, 424242, NULL, NULL), LORADB_NOT_FOUND);
  CHECK_CODE(loradb_acquire(store, r2, 0, &lease, NULL, NULL), LORADB_OK);
  CHECK_CODE(loradb_lease_tensor_find(lease, S(kQA), &v), LORADB_OK);
  CHECK(view_matches_seed(&v, 5.0f));
  st = stats_of(store);
  CHECK(st.cpu_prefetches == 1 && st.cpu_loads == 2);
  CHECK_CODE(loradb_release(&lease), LORADB_OK);

  /* Deleting a revision drops its unleased copy; a leased copy stays valid until released. */
  {
    uint64_t r3 = publish(store, 9.0f, NULL), r4 = publish(store, 11.0f, NULL);
    loradb_lease_t* held = NULL;
    CHECK_CODE(loradb_acquire(store, r3, 0, &lease, NULL, NULL), LORADB_OK);
    CHECK_CODE(loradb_release(&lease), LORADB_OK);
    CHECK_CODE(loradb_acquire(store, r4, 0, &held, NULL, NULL), LORADB_OK);
    st = stats_of(store);
    n = (size_t)st.cpu_resident_entries;
    CHECK_CODE(loradb_revision_delete(store, r3, NULL), LORADB_OK);
    CHECK_CODE(loradb_revision_delete(store, r4, NULL), LORADB_OK);
    st = stats_of(store);
    CHECK(st.cpu_resident_entries == n - 1); /* r3 dropped, r4 leased */
    CHECK_CODE(loradb_acquire(store, r3, 0, &lease, NULL, NULL), LORADB_NOT_FOUND);
    CHECK_CODE(loradb_lease_tensor_find(held, S(kQA), &v), LORADB_OK);
    CHECK(view_matches_seed(&v, 11.0f));
    CHECK_CODE(loradb_release(&held), LORADB_OK);
  }
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void test_close_with_live_leases(void) {
  loradb_store_t* store = open_with("store", NULL);
  loradb_store_t* stale;
  loradb_lease_t *lease = NULL, *stale_lease;
  loradb_revision_info_t info = info_init();
  loradb_tensor_view_t v = view_init();
  uint64_t id;
  if (store == NULL) return;
  id = publish(store, 2.0f, "canary");
  CHECK_CODE(loradb_acquire(store, id, 0, &lease, NULL, NULL), LORADB_OK);
  /* The rule: leases first. close refuses and the store stays usable. */
  CHECK_CODE(loradb_close(&store), LORADB_CONFLICT);
  CHECK(store != NULL);
  CHECK_CODE(loradb_revision_get(store, id, &info, NULL), LORADB_OK);
  CHECK_CODE(loradb_lease_tensor_find(lease, S(kQA), &v), LORADB_OK);
  CHECK(view_matches_seed(&v, 2.0f));
  stale_lease = lease;
  CHECK_CODE(loradb_release(&lease), LORADB_OK);
  stale = store;
  CHECK_CODE(loradb_close(&store), LORADB_OK);
  CHECK(store == NULL);
  /* After close: stale store and lease copies are refused, nothing crashes. */
  CHECK_CODE(loradb_release(&stale_lease), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_acquire(stale, id, 0, &lease, NULL, NULL), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_prefetch(stale, id, NULL, NULL), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_evict(stale, id, LORADB_TIER_CPU, NULL), LORADB_INVALID_HANDLE);
  {
    loradb_stats_t st;
    memset(&st, 0, sizeof(st));
    st.struct_size = sizeof(st);
    CHECK_CODE(loradb_stats(stale, &st, NULL), LORADB_INVALID_HANDLE);
    CHECK_CODE(loradb_stats(NULL, &st, NULL), LORADB_INVALID_ARGUMENT);
  }
  CHECK_CODE(loradb_close(&stale), LORADB_INVALID_HANDLE);

  /* The same with a device batch lease. */
  {
    loradb_options_t* o = make_options(LORADB_DEVICE_HOST, 1 << 20, 4096);
    loradb_batch_lease_t* batch = NULL;
    remove_tmp();
    make_tmp();
    store = open_with("store2", o);
    CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
    if (store == NULL) return;
    id = publish(store, 3.0f, "canary");
    CHECK_CODE(loradb_acquire_batch(store, &id, 1, &batch, NULL, NULL), LORADB_OK);
    CHECK_CODE(loradb_close(&store), LORADB_CONFLICT);
    CHECK_CODE(loradb_batch_release(&batch), LORADB_OK);
    CHECK_CODE(loradb_close(&store), LORADB_OK);
  }
}

static void test_device_batch_lease(void) {
  loradb_options_t* o = make_options(LORADB_DEVICE_HOST, 1 << 20, 4096);
  loradb_store_t* store = open_with("store", o);
  loradb_batch_lease_t *batch = NULL, *stale;
  loradb_batch_adapter_t a;
  loradb_tensor_view_t v = view_init();
  loradb_stats_t st;
  loradb_located_t l;
  uint64_t r1, r2, ids[3];
  size_t idx = 99;
  uint32_t retry = 5;
  CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
  if (store == NULL) return;
  r1 = publish(store, 1.0f, "canary");
  r2 = publish(store, 7.0f, "serving");
  ids[0] = r2;
  ids[1] = r1;
  ids[2] = r2; /* duplicates allowed */
  memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);

  CHECK_CODE(loradb_acquire_batch(store, NULL, 1, &batch, NULL, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_acquire_batch(store, ids, 0, &batch, NULL, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_acquire_batch(store, ids, 3, NULL, NULL, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_acquire_batch(NULL, ids, 3, &batch, NULL, NULL), LORADB_INVALID_ARGUMENT);
  {
    uint64_t bad[2];
    char* err = NULL;
    bad[0] = r1;
    bad[1] = 777777;
    CHECK_CODE(loradb_acquire_batch(store, bad, 2, &batch, &retry, &err), LORADB_NOT_FOUND);
    CHECK(batch == NULL && retry == 0);
    CHECK(err != NULL && strstr(err, "777777") != NULL);
    loradb_free(err);
    st = stats_of(store);
    CHECK(st.device_leased_adapters == 0); /* all or nothing */
  }

  CHECK_CODE(loradb_acquire_batch(store, ids, 3, &batch, &retry, NULL), LORADB_OK);
  if (batch == NULL) return;
  CHECK(loradb_batch_size(batch) == 2);
  CHECK_CODE(loradb_batch_adapter(batch, 0, &a), LORADB_OK);
  CHECK(a.revision == r2 && a.tensor_count == 4 && a.bytes > 0 && a.pages >= 1);
  CHECK(a.device_pointers == 0); /* host backend */
  CHECK_CODE(loradb_batch_adapter(batch, 2, &a), LORADB_OUT_OF_RANGE);
  a.struct_size = 3;
  CHECK_CODE(loradb_batch_adapter(batch, 0, &a), LORADB_INVALID_ARGUMENT);
  a.struct_size = sizeof(a);
  CHECK_CODE(loradb_batch_find(batch, r1, &idx), LORADB_OK);
  CHECK(idx == 1);
  CHECK_CODE(loradb_batch_find(batch, 12345, &idx), LORADB_NOT_FOUND);
  CHECK_CODE(loradb_batch_find(batch, r1, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_batch_tensor_find(batch, 1, S(kQA), &v), LORADB_OK);
  CHECK(view_matches_seed(&v, 1.0f));
  CHECK_CODE(loradb_batch_tensor_find(batch, 0, S(kQA), &v), LORADB_OK);
  CHECK(view_matches_seed(&v, 7.0f));
  CHECK_CODE(loradb_batch_tensor_find(batch, 0, S("nope"), &v), LORADB_NOT_FOUND);
  CHECK_CODE(loradb_batch_tensor_find(batch, 2, S(kQA), &v), LORADB_OUT_OF_RANGE);
  CHECK_CODE(loradb_batch_tensor_at(batch, 0, 3, &v), LORADB_OK);
  CHECK(v.data != NULL && v.nbytes > 0 && v.ndim == 2);
  CHECK_CODE(loradb_batch_tensor_at(batch, 0, 4, &v), LORADB_OUT_OF_RANGE);
  CHECK_CODE(loradb_batch_tensor_at(batch, 5, 0, &v), LORADB_OUT_OF_RANGE);
  CHECK_CODE(loradb_batch_tensor_at(batch, 0, 0, NULL), LORADB_INVALID_ARGUMENT);

  /* The live tier is GPU (the device tier) with its slot; leased copies cannot be evicted. */
  CHECK_CODE(loradb_batch_adapter(batch, 1, &a), LORADB_OK);
  l = locate(store, "canary");
  CHECK(l.tier == LORADB_TIER_GPU && l.has_slot == 1 && l.slot == a.slot);
  CHECK(l.device_leases == 1);
  free_located(&l);
  CHECK_CODE(loradb_evict(store, r1, LORADB_TIER_GPU, NULL), LORADB_CONFLICT);
  st = stats_of(store);
  CHECK(st.device == LORADB_DEVICE_HOST);
  CHECK(st.device_batches == 1 && st.device_batch_failures == 1);
  CHECK(st.device_misses >= 2 && st.device_resident_adapters == 2);
  CHECK(st.device_leased_adapters == 2);
  CHECK(st.device_arena_bytes == (1 << 20) && st.device_page_bytes == 4096);
  CHECK(st.device_pages_total == 256 && st.device_pages_free < 256);
  CHECK(st.device_payload_bytes > 0);
  CHECK(st.device_fragmentation >= 0.0 && st.device_fragmentation <= 1.0);

  stale = batch;
  CHECK_CODE(loradb_batch_release(&batch), LORADB_OK);
  CHECK(batch == NULL);
  CHECK_CODE(loradb_batch_release(&stale), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_batch_release(NULL), LORADB_INVALID_ARGUMENT);
  CHECK(loradb_batch_size(stale) == 0);
  CHECK_CODE(loradb_batch_adapter(stale, 0, &a), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_batch_tensor_at(stale, 0, 0, &v), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_batch_find(stale, r1, &idx), LORADB_INVALID_HANDLE);

  /* Unleased: a second batch hits; then evict from the device tier. */
  CHECK_CODE(loradb_acquire_batch(store, &r1, 1, &batch, NULL, NULL), LORADB_OK);
  CHECK_CODE(loradb_batch_release(&batch), LORADB_OK);
  st = stats_of(store);
  CHECK(st.device_hits == 1 && st.device_leased_adapters == 0);
  CHECK_CODE(loradb_evict(store, r1, LORADB_TIER_GPU, NULL), LORADB_OK);
  CHECK_CODE(loradb_evict(store, r1, LORADB_TIER_GPU, NULL), LORADB_NOT_FOUND);
  l = locate(store, "canary");
  CHECK(l.tier == LORADB_TIER_CPU && l.has_slot == 0); /* still in the CPU cache */
  free_located(&l);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void test_batch_that_does_not_fit(void) {
  /* One 4 KiB page: one tiny adapter fits, two do not. */
  loradb_options_t* o = make_options(LORADB_DEVICE_HOST, 4096, 4096);
  loradb_store_t* store = open_with("store", o);
  loradb_batch_lease_t *b1 = NULL, *b2 = NULL;
  loradb_stats_t st;
  uint64_t ids[2];
  uint32_t retry = 0;
  char* err = NULL;
  CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
  if (store == NULL) return;
  ids[0] = publish(store, 1.0f, NULL);
  ids[1] = publish(store, 2.0f, NULL);
  CHECK_CODE(loradb_acquire_batch(store, ids, 2, &b1, &retry, &err), LORADB_RESOURCE_EXHAUSTED);
  CHECK(b1 == NULL && retry >= 1 && err != NULL);
  loradb_free(err);
  st = stats_of(store);
  CHECK(st.device_leased_adapters == 0);
  /* One pinned adapter fills the arena: the other cannot come in until it is released. */
  CHECK_CODE(loradb_acquire_batch(store, &ids[0], 1, &b1, NULL, NULL), LORADB_OK);
  retry = 0;
  CHECK_CODE(loradb_acquire_batch(store, &ids[1], 1, &b2, &retry, NULL), LORADB_RESOURCE_EXHAUSTED);
  CHECK(b2 == NULL && retry >= 1);
  CHECK_CODE(loradb_batch_release(&b1), LORADB_OK);
  CHECK_CODE(loradb_acquire_batch(store, &ids[1], 1, &b2, NULL, NULL), LORADB_OK);
  st = stats_of(store);
  CHECK(st.device_evictions == 1 && st.device_resident_adapters == 1);
  CHECK_CODE(loradb_batch_release(&b2), LORADB_OK);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

/* A load held in flight (blob replaced by a FIFO) with max 1 in flight and no queue: another
 * revision's acquire and prefetch are rejected at once with a retry-after hint; an acquire of
 * the pending revision with a timeout gives up with LORADB_UNAVAILABLE. */
static void test_load_bound_and_timeout(void) {
  loradb_options_t* o = NULL;
  loradb_store_t* store;
  loradb_lease_t* lease = NULL;
  loradb_stats_t st;
  uint64_t blocked, other;
  uint32_t retry = 0;
  char* path;
  char* err = NULL;
  int fd;
  CHECK_CODE(loradb_options_create(&o), LORADB_OK);
  CHECK_CODE(loradb_options_set_loader(o, LORADB_LOADER_PREAD, 1, 0, 60000), LORADB_OK);
  store = open_with("store", o);
  CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
  if (store == NULL) return;
  blocked = publish(store, 1.0f, "canary");
  other = publish(store, 2.0f, "serving");
  path = blob_path_of(store, "canary");
  if (path == NULL) return;
  blob_to_fifo(path);

  CHECK_CODE(loradb_prefetch(store, blocked, &retry, NULL), LORADB_OK);
  CHECK(retry == 0);
  CHECK_CODE(loradb_acquire(store, other, 0, &lease, &retry, &err), LORADB_RESOURCE_EXHAUSTED);
  CHECK(lease == NULL && retry >= 1 && err != NULL);
  loradb_free(err);
  retry = 0;
  CHECK_CODE(loradb_prefetch(store, other, &retry, NULL), LORADB_RESOURCE_EXHAUSTED);
  CHECK(retry >= 1);
  CHECK_CODE(loradb_acquire(store, blocked, 50, &lease, NULL, NULL), LORADB_UNAVAILABLE);
  CHECK(lease == NULL);
  st = stats_of(store);
  CHECK(st.cpu_rejections == 2);
  CHECK(st.cpu_inflight_loads + st.cpu_queued_loads == 1);

  /* Let the load finish: it fails (a FIFO is not the blob), and the failure is remembered. */
  fd = open_fifo_writer(path);
  CHECK(fd >= 0);
  CHECK(loradb_acquire(store, blocked, 0, &lease, NULL, NULL) != LORADB_OK);
  if (fd >= 0) close(fd);
  CHECK(lease == NULL);
  CHECK_CODE(loradb_acquire(store, other, 0, &lease, NULL, NULL), LORADB_OK);
  CHECK_CODE(loradb_release(&lease), LORADB_OK);
  st = stats_of(store);
  CHECK(st.cpu_load_failures == 1 && st.cpu_loads == 1);
  CHECK(st.cpu_inflight_loads == 0 && st.cpu_queued_loads == 0);
  loradb_free(path);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

/* A missing blob is LORADB_NOT_FOUND, a damaged one LORADB_CORRUPT; both remembered briefly. */
static void test_missing_and_corrupt_blobs(void) {
  loradb_options_t* o = NULL;
  loradb_store_t* store;
  loradb_lease_t* lease = NULL;
  loradb_stats_t st;
  uint64_t missing, corrupt;
  char* path;
  CHECK_CODE(loradb_options_create(&o), LORADB_OK);
  /* Failures remembered for a minute, so the second requests are negative hits. */
  CHECK_CODE(loradb_options_set_loader(o, LORADB_LOADER_AUTO, 4, 16, 60000), LORADB_OK);
  store = open_with("store", o);
  CHECK_CODE(loradb_options_destroy(&o), LORADB_OK);
  if (store == NULL) return;
  missing = publish(store, 1.0f, "canary");
  corrupt = publish(store, 2.0f, "serving");
  path = blob_path_of(store, "canary");
  if (path != NULL) CHECK(unlink(path) == 0);
  loradb_free(path);
  path = blob_path_of(store, "serving");
  if (path != NULL) {
    /* Flip one byte of the data region (the end of the file). */
    FILE* f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (f != NULL) {
      int c;
      CHECK(fseek(f, -8, SEEK_END) == 0);
      c = fgetc(f);
      CHECK(fseek(f, -8, SEEK_END) == 0);
      fputc(c ^ 0x5a, f);
      fclose(f);
    }
  }
  loradb_free(path);
  CHECK_CODE(loradb_acquire(store, missing, 0, &lease, NULL, NULL), LORADB_NOT_FOUND);
  CHECK_CODE(loradb_acquire(store, missing, 0, &lease, NULL, NULL), LORADB_NOT_FOUND);
  CHECK_CODE(loradb_acquire(store, corrupt, 0, &lease, NULL, NULL), LORADB_CORRUPT);
  CHECK_CODE(loradb_prefetch(store, corrupt, NULL, NULL), LORADB_CORRUPT);
  CHECK(lease == NULL);
  st = stats_of(store);
  CHECK(st.cpu_load_failures == 2 && st.cpu_negative_hits == 2);
  CHECK(st.loader_checksum_failures == 1);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

/* Leases acquired on worker threads and released on another thread. */
typedef struct {
  loradb_store_t* store;
  uint64_t ids[2];
  loradb_lease_t* leases[16];
  int failures;
} lease_worker_t;

static void* lease_worker(void* arg) {
  lease_worker_t* w = (lease_worker_t*)arg;
  int i;
  for (i = 0; i < 16; ++i) {
    if (loradb_acquire(w->store, w->ids[i % 2], 0, &w->leases[i], NULL, NULL) != LORADB_OK) {
      ++w->failures;
    }
  }
  return NULL;
}

static void test_leases_across_threads(void) {
  loradb_store_t* store = open_with("store", NULL);
  lease_worker_t workers[4];
  pthread_t threads[4];
  loradb_stats_t st;
  int i, j;
  uint64_t ids[2];
  if (store == NULL) return;
  ids[0] = publish(store, 1.0f, NULL);
  ids[1] = publish(store, 2.0f, NULL);
  memset(workers, 0, sizeof(workers));
  for (i = 0; i < 4; ++i) {
    workers[i].store = store;
    workers[i].ids[0] = ids[0];
    workers[i].ids[1] = ids[1];
    CHECK(pthread_create(&threads[i], NULL, lease_worker, &workers[i]) == 0);
  }
  for (i = 0; i < 4; ++i) CHECK(pthread_join(threads[i], NULL) == 0);
  st = stats_of(store);
  CHECK(st.cpu_loads == 2); /* single flight: two distinct revisions, two loads */
  CHECK(st.cpu_hits + st.cpu_misses == 64);
  CHECK_CODE(loradb_close(&store), LORADB_CONFLICT);
  for (i = 0; i < 4; ++i) {
    CHECK(workers[i].failures == 0);
    for (j = 0; j < 16; ++j) {
      loradb_tensor_view_t v = view_init();
      CHECK_CODE(loradb_lease_tensor_find(workers[i].leases[j], S(kQA), &v), LORADB_OK);
      CHECK(view_matches_seed(&v, (j % 2) == 0 ? 1.0f : 2.0f));
      CHECK_CODE(loradb_release(&workers[i].leases[j]), LORADB_OK);
    }
  }
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void run_fresh(const char* name, void (*fn)(void)) {
  make_tmp();
  run_test(name, fn);
  remove_tmp();
}

int main(void) {
  run_fresh("residency_options_misuse", test_residency_options_misuse);
  run_fresh("without_tiers", test_without_tiers);
  run_fresh("cpu_lease_views_and_release", test_cpu_lease_views_and_release);
  run_fresh("close_with_live_leases", test_close_with_live_leases);
  run_fresh("device_batch_lease", test_device_batch_lease);
  run_fresh("batch_that_does_not_fit", test_batch_that_does_not_fit);
  run_fresh("load_bound_and_timeout", test_load_bound_and_timeout);
  run_fresh("missing_and_corrupt_blobs", test_missing_and_corrupt_blobs);
  run_fresh("leases_across_threads", test_leases_across_threads);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
