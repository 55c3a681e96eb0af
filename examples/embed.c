/* Embedding loradb from C: open (or create) a store, register a base, create a policy, publish
 * a rank-2 adapter from in-memory tensors with alias "serving", resolve it, read its tensors
 * back, pin it in the CPU cache with a lease and print what Locate says (tier 1 = cpu while
 * leased), then release the lease (leases go before close) and close.
 *
 * Build against an installed loradb:
 *   cmake -S examples -B build-ex -DCMAKE_PREFIX_PATH=/usr/local && cmake --build build-ex
 *   cc examples/embed.c $(pkg-config --cflags --libs loradb) -o embed
 * Run: ./embed STORE_DIR */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "loradb.h"

static int check(loradb_status_t st, char* err, const char* what) {
  if (st == LORADB_OK) return 0;
  fprintf(stderr, "%s: %s: %s\n", what, loradb_status_name(st), err != NULL ? err : "");
  loradb_free(err);
  return 1;
}

int main(int argc, char** argv) {
  static const char kModules[] =
      "{\"modules\": [{\"name\": \"layers.0.self_attn.q_proj\", \"in\": 4, \"out\": 4}]}";
  float a[2 * 4] = {1, 2, 3, 4, 5, 6, 7, 8};
  float b[4 * 2] = {8, 7, 6, 5, 4, 3, 2, 1};
  int64_t shape_a[2] = {2, 4}, shape_b[2] = {4, 2};
  loradb_tensor_t tensors[2];
  loradb_publish_options_t opts;
  loradb_revision_info_t rev;
  loradb_located_t loc;
  loradb_tensor_view_t view;
  loradb_store_t* store = NULL;
  loradb_tensors_t* read = NULL;
  loradb_lease_t* lease = NULL;
  uint32_t retry_after_ms = 0;
  char* err = NULL;
  loradb_status_t st;
  size_t i;

  if (argc != 2) {
    fprintf(stderr, "usage: %s STORE_DIR\n", argv[0]);
    return 2;
  }
  printf("loradb %s\n", loradb_version());
  if (check(loradb_open(argv[1], strlen(argv[1]), NULL, &store, &err), err, "open")) return 1;

  st = loradb_base_add_modules(store, "demo-base", 9, kModules, sizeof(kModules) - 1, &err);
  if (st != LORADB_ALREADY_EXISTS && check(st, err, "base")) return 1;
  st = loradb_policy_create(store, "demo/policy", 11, "demo-base", 9, NULL, 0, NULL, &err);
  if (st != LORADB_ALREADY_EXISTS && check(st, err, "policy")) return 1;

  tensors[0].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
  tensors[1].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
  for (i = 0; i < 2; ++i) {
    tensors[i].name_len = strlen(tensors[i].name);
    tensors[i].dtype = LORADB_DTYPE_F32;
    tensors[i].ndim = 2;
  }
  tensors[0].shape = shape_a;
  tensors[0].data = a;
  tensors[0].nbytes = sizeof(a);
  tensors[1].shape = shape_b;
  tensors[1].data = b;
  tensors[1].nbytes = sizeof(b);

  memset(&opts, 0, sizeof(opts));
  opts.struct_size = sizeof(opts);
  opts.alias = "serving";
  opts.alias_len = 7;
  memset(&rev, 0, sizeof(rev));
  rev.struct_size = sizeof(rev);
  if (check(loradb_publish_tensors(store, "demo/policy", 11, tensors, 2, &opts, &rev, &err), err,
            "publish")) {
    return 1;
  }
  printf("published revision %llu (seq %llu, %u tensors, %llu bytes)\n", (unsigned long long)rev.id,
         (unsigned long long)rev.seq, rev.tensor_count, (unsigned long long)rev.blob_bytes);

  if (check(loradb_revision_resolve(store, "demo/policy:serving", 19, &rev, &err), err,
            "resolve")) {
    return 1;
  }
  if (check(loradb_revision_read_tensors(store, rev.id, &read, &err), err, "read")) return 1;
  memset(&view, 0, sizeof(view));
  view.struct_size = sizeof(view);
  for (i = 0; i < loradb_tensors_count(read); ++i) {
    if (loradb_tensors_at(read, i, &view) != LORADB_OK) return 1;
    printf("  %.*s [%lld, %lld] first=%g\n", (int)view.name_len, view.name,
           (long long)view.shape[0], (long long)view.shape[1],
           (double)((const float*)view.data)[0]);
  }
  loradb_tensors_destroy(&read);

  /* A lease pins the revision in the CPU cache; its views stay valid until the release. */
  if (check(loradb_acquire(store, rev.id, 0, &lease, &retry_after_ms, &err), err, "acquire")) {
    return 1;
  }
  if (loradb_lease_tensor_at(lease, 0, &view) != LORADB_OK) return 1;
  printf("leased %zu tensors, first=%g\n", loradb_lease_tensor_count(lease),
         (double)((const float*)view.data)[0]);

  memset(&loc, 0, sizeof(loc));
  loc.struct_size = sizeof(loc);
  if (check(loradb_locate(store, "demo/policy", 11, "serving", 7, &loc, &err), err, "locate")) {
    return 1;
  }
  printf("serving -> revision %llu on base %s, tier %d, blob %s\n",
         (unsigned long long)loc.revision_id, loc.base_name, (int)loc.tier, loc.blob_path);
  loradb_free(loc.base_name);
  loradb_free(loc.blob_path);
  loradb_release(&lease);
  return loradb_close(&store) == LORADB_OK ? 0 : 1;
}
