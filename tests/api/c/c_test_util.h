/* Helpers shared by the C API tests (compiled as C11): a tiny runner (CHECK, CHECK_CODE,
 * run_test, "N passed, N failed"), a temporary directory per test, and a rank-2 F32 adapter for
 * the "tiny" base. Each test program includes this once. */
#ifndef LORADB_TESTS_API_C_C_TEST_UTIL_H_
#define LORADB_TESTS_API_C_C_TEST_UTIL_H_

#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loradb.h"

static int g_passed = 0, g_failed = 0, g_current_failed = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      g_current_failed = 1;                                                      \
    }                                                                            \
  } while (0)

#define CHECK_CODE(expr, code)                                                             \
  do {                                                                                     \
    loradb_status_t got_ = (expr);                                                         \
    if (got_ != (code)) {                                                                  \
      fprintf(stderr, "  %s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr, \
              loradb_status_name(got_), loradb_status_name(code));                         \
      g_current_failed = 1;                                                                \
    }                                                                                      \
  } while (0)

#define S(lit) (lit), (sizeof(lit) - 1)

static inline void run_test(const char* name, void (*fn)(void)) {
  g_current_failed = 0;
  fn();
  if (g_current_failed) {
    ++g_failed;
    printf("FAIL %s\n", name);
  } else {
    ++g_passed;
    printf("ok   %s\n", name);
  }
}

/* ---- helpers */

static char g_tmp[256];

static inline int remove_entry(const char* path, const struct stat* sb, int flag, struct FTW* ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static inline void make_tmp(void) {
  const char* base = getenv("TMPDIR");
  snprintf(g_tmp, sizeof(g_tmp), "%s/loradb-c-test-XXXXXX", base != NULL ? base : "/tmp");
  if (mkdtemp(g_tmp) == NULL) {
    perror("mkdtemp");
    exit(2);
  }
}

static inline void remove_tmp(void) { nftw(g_tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static inline const char* path_in_tmp(const char* name, char* buf, size_t cap) {
  snprintf(buf, cap, "%s/%s", g_tmp, name);
  return buf;
}

/* A rank-2 F32 adapter for the "tiny" base: q_proj (in 8, out 16) and k_proj (in 8, out 4). */
typedef struct {
  float a_q[2 * 8], b_q[16 * 2], a_k[2 * 8], b_k[4 * 2];
  int64_t shape_a[2], shape_bq[2], shape_bk[2];
  loradb_tensor_t t[4];
} adapter_t;

static inline void make_adapter(adapter_t* ad, float seed) {
  size_t i;
  for (i = 0; i < 16; ++i) ad->a_q[i] = seed + (float)i;
  for (i = 0; i < 32; ++i) ad->b_q[i] = seed - (float)i;
  for (i = 0; i < 16; ++i) ad->a_k[i] = seed * 2 + (float)i;
  for (i = 0; i < 8; ++i) ad->b_k[i] = seed * 3 + (float)i;
  ad->shape_a[0] = 2;
  ad->shape_a[1] = 8;
  ad->shape_bq[0] = 16;
  ad->shape_bq[1] = 2;
  ad->shape_bk[0] = 4;
  ad->shape_bk[1] = 2;
  {
    const char* names[4] = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
                            "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",
                            "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"};
    const void* data[4] = {ad->a_q, ad->b_q, ad->a_k, ad->b_k};
    const int64_t* shapes[4] = {ad->shape_a, ad->shape_bq, ad->shape_a, ad->shape_bk};
    size_t bytes[4] = {sizeof(ad->a_q), sizeof(ad->b_q), sizeof(ad->a_k), sizeof(ad->b_k)};
    for (i = 0; i < 4; ++i) {
      ad->t[i].name = names[i];
      ad->t[i].name_len = strlen(names[i]);
      ad->t[i].dtype = LORADB_DTYPE_F32;
      ad->t[i].shape = shapes[i];
      ad->t[i].ndim = 2;
      ad->t[i].data = data[i];
      ad->t[i].nbytes = bytes[i];
    }
  }
}

static const char kModules[] =
    "{\"modules\": [{\"name\": \"layers.0.self_attn.q_proj\", \"in\": 8, \"out\": 16},"
    " {\"name\": \"layers.0.self_attn.k_proj\", \"in\": 8, \"out\": 4}]}";

/* Opens a fresh store with base "tiny" and policy "team/a". */
static inline loradb_store_t* open_fixture(void) {
  char path[512];
  loradb_store_t* store = NULL;
  char* err = NULL;
  path_in_tmp("store", path, sizeof(path));
  CHECK_CODE(loradb_open(path, strlen(path), NULL, &store, &err), LORADB_OK);
  CHECK(err == NULL);
  CHECK(store != NULL);
  CHECK_CODE(loradb_base_add_modules(store, S("tiny"), S(kModules), NULL), LORADB_OK);
  CHECK_CODE(
      loradb_policy_create(store, S("team/a"), S("tiny"), S("{\"owner\":\"c\"}"), NULL, NULL),
      LORADB_OK);
  return store;
}

static inline loradb_revision_info_t info_init(void) {
  loradb_revision_info_t info;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  return info;
}

static inline uint64_t publish(loradb_store_t* store, float seed, const char* alias) {
  adapter_t ad;
  loradb_publish_options_t opts;
  loradb_revision_info_t info = info_init();
  char* err = NULL;
  make_adapter(&ad, seed);
  memset(&opts, 0, sizeof(opts));
  opts.struct_size = sizeof(opts);
  opts.alias = alias;
  opts.alias_len = alias != NULL ? strlen(alias) : 0;
  CHECK_CODE(loradb_publish_tensors(store, S("team/a"), ad.t, 4, &opts, &info, &err), LORADB_OK);
  if (err != NULL) {
    fprintf(stderr, "  publish: %s\n", err);
    loradb_free(err);
  }
  return info.id;
}

#endif /* LORADB_TESTS_API_C_C_TEST_UTIL_H_ */
