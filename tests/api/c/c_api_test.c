/* Tests of the loradb C API, compiled as C11 (not C++): the whole lifecycle (open, bases,
 * policies, publish, read tensors, aliases, rollback, locate, checkpoints, verify, export and
 * re-import) and misuse: NULL handles and pointers, double close, use after close, wrong struct
 * sizes and tensor sizes. A tiny runner prints "N passed, N failed" and exits non-zero on any
 * failure. */
#define _XOPEN_SOURCE 700
#include "c_test_util.h"

/* ---- tests */

static void test_version_and_status_names(void) {
  CHECK(strcmp(loradb_version(), "0.1.0") == 0);
  CHECK(strcmp(loradb_status_name(LORADB_NOT_FOUND), "LORADB_NOT_FOUND") == 0);
  CHECK(strcmp(loradb_status_name((loradb_status_t)999), "LORADB_UNKNOWN_STATUS") == 0);
  loradb_free(NULL);
}

static void test_open_misuse_and_options(void) {
  char path[512];
  loradb_store_t* store = NULL;
  loradb_options_t* opts = NULL;
  loradb_options_t* stale = NULL;
  char* err = NULL;
  path_in_tmp("missing", path, sizeof(path));
  CHECK_CODE(loradb_open(path, strlen(path), NULL, NULL, &err), LORADB_INVALID_ARGUMENT);
  CHECK(err != NULL && strstr(err, "out") != NULL);
  loradb_free(err);
  CHECK_CODE(loradb_open(NULL, 5, NULL, &store, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_open("", 0, NULL, &store, NULL), LORADB_INVALID_ARGUMENT);
  CHECK(store == NULL);

  CHECK_CODE(loradb_options_create(NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_create(&opts), LORADB_OK);
  CHECK_CODE(loradb_options_set_create_if_missing(opts, 2), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_options_set_create_if_missing(opts, 0), LORADB_OK);
  CHECK_CODE(loradb_options_set_no_sync(opts, 1), LORADB_OK);
  CHECK_CODE(loradb_options_set_blob_root(opts, NULL, 3), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_open(path, strlen(path), opts, &store, &err), LORADB_NOT_FOUND);
  CHECK(err != NULL);
  loradb_free(err);
  CHECK(store == NULL);
  CHECK(access(path, F_OK) != 0); /* nothing was created */

  stale = opts;
  CHECK_CODE(loradb_options_destroy(&opts), LORADB_OK);
  CHECK(opts == NULL);
  CHECK_CODE(loradb_options_destroy(&opts), LORADB_OK);              /* NULL handle: no-op */
  CHECK_CODE(loradb_options_destroy(&stale), LORADB_INVALID_HANDLE); /* stale copy */
  CHECK_CODE(loradb_options_set_no_sync(stale, 1), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_open(path, strlen(path), stale, &store, NULL), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_options_destroy(NULL), LORADB_INVALID_ARGUMENT);
}

static void test_null_and_closed_store_handles(void) {
  loradb_store_t* store = open_fixture();
  loradb_store_t* stale = store;
  loradb_revision_info_t info = info_init();
  char* err = NULL;
  CHECK_CODE(loradb_revision_get(NULL, 1, &info, &err), LORADB_INVALID_ARGUMENT);
  CHECK(err != NULL);
  loradb_free(err);
  CHECK_CODE(loradb_policy_create(NULL, S("x"), S("tiny"), NULL, 0, NULL, NULL),
             LORADB_INVALID_ARGUMENT);

  CHECK_CODE(loradb_close(&store), LORADB_OK);
  CHECK(store == NULL);
  CHECK_CODE(loradb_close(&store), LORADB_OK); /* double close through the nulled handle */
  CHECK_CODE(loradb_close(&stale), LORADB_INVALID_HANDLE); /* double close through a copy */
  CHECK_CODE(loradb_close(NULL), LORADB_INVALID_ARGUMENT);
  /* Use after close through a stale copy is detected, not a crash. */
  CHECK_CODE(loradb_revision_get(stale, 1, &info, &err), LORADB_INVALID_HANDLE);
  CHECK(err != NULL && strstr(err, "closed") != NULL);
  loradb_free(err);
  CHECK_CODE(loradb_alias_set(stale, S("team/a"), S("serving"), 1, NULL, 0, NULL),
             LORADB_INVALID_HANDLE);
}

static void test_bases_and_policies(void) {
  loradb_store_t* store = open_fixture();
  char* json = NULL;
  size_t len = 0;
  uint64_t next = 99, id = 0;
  char* err = NULL;
  CHECK_CODE(loradb_base_add_modules(store, S("tiny"), S(kModules), NULL), LORADB_ALREADY_EXISTS);
  CHECK_CODE(loradb_base_add_modules(store, S("bad"), S("{not json"), &err),
             LORADB_INVALID_ARGUMENT);
  CHECK(err != NULL);
  loradb_free(err);
  CHECK_CODE(loradb_base_list(store, &json, &len, NULL), LORADB_OK);
  CHECK(json != NULL && strlen(json) == len && strstr(json, "\"tiny\"") != NULL);
  loradb_free(json);
  CHECK_CODE(loradb_base_list(store, NULL, &len, NULL), LORADB_INVALID_ARGUMENT);

  CHECK_CODE(loradb_policy_create(store, S("team/a"), S("tiny"), NULL, 0, NULL, NULL),
             LORADB_ALREADY_EXISTS);
  CHECK_CODE(loradb_policy_create(store, S("team/b"), S("nobase"), NULL, 0, NULL, NULL),
             LORADB_NOT_FOUND);
  CHECK_CODE(loradb_policy_create(store, S("../etc"), S("tiny"), NULL, 0, NULL, NULL),
             LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_policy_create(store, S("team/b"), S("tiny"), S("[1]"), NULL, NULL),
             LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_policy_create(store, S("team/b"), S("tiny"), NULL, 0, &id, NULL), LORADB_OK);
  CHECK(id > 0);
  CHECK_CODE(loradb_policy_create(store, S("team/c"), S("tiny"), NULL, 0, NULL, NULL), LORADB_OK);
  CHECK_CODE(loradb_policy_list(store, 0, 2, &json, &len, &next, NULL), LORADB_OK);
  CHECK(strstr(json, "team/a") != NULL && strstr(json, "team/b") != NULL);
  CHECK(strstr(json, "team/c") == NULL);
  CHECK(next != 0);
  loradb_free(json);
  CHECK_CODE(loradb_policy_list(store, next, 2, &json, &len, &next, NULL), LORADB_OK);
  CHECK(strstr(json, "team/c") != NULL);
  CHECK(next == 0);
  loradb_free(json);
  CHECK_CODE(loradb_policy_list(store, 0, 0, &json, &len, &next, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_policy_archive(store, S("team/c"), 1, NULL), LORADB_OK);
  CHECK_CODE(loradb_policy_archive(store, S("team/c"), 7, NULL), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_policy_archive(store, S("team/zz"), 1, NULL), LORADB_NOT_FOUND);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void test_publish_read_and_wrong_sizes(void) {
  loradb_store_t* store = open_fixture();
  adapter_t ad;
  loradb_revision_info_t info = info_init();
  loradb_tensors_t* tensors = NULL;
  loradb_tensors_t* stale = NULL;
  loradb_tensor_view_t view;
  char* err = NULL;
  uint64_t id;
  size_t i;
  make_adapter(&ad, 1.0f);

  /* nbytes that does not match shape x dtype */
  ad.t[1].nbytes -= 4;
  CHECK_CODE(loradb_publish_tensors(store, S("team/a"), ad.t, 4, NULL, &info, &err),
             LORADB_INVALID_ARGUMENT);
  CHECK(err != NULL && strstr(err, "nbytes") != NULL);
  loradb_free(err);
  make_adapter(&ad, 1.0f);
  ad.t[0].data = NULL;
  CHECK_CODE(loradb_publish_tensors(store, S("team/a"), ad.t, 4, NULL, NULL, NULL),
             LORADB_INVALID_ARGUMENT);
  make_adapter(&ad, 1.0f);
  ad.t[2].dtype = (loradb_dtype_t)77;
  CHECK_CODE(loradb_publish_tensors(store, S("team/a"), ad.t, 4, NULL, NULL, NULL),
             LORADB_INVALID_ARGUMENT);
  make_adapter(&ad, 1.0f);
  CHECK_CODE(loradb_publish_tensors(store, S("team/a"), NULL, 4, NULL, NULL, NULL),
             LORADB_INVALID_ARGUMENT);
  /* shapes that do not fit the base (k_proj out 4, here 16) */
  ad.t[3].shape = ad.shape_bq;
  ad.t[3].nbytes = sizeof(ad.b_q);
  ad.t[3].data = ad.b_q;
  CHECK_CODE(loradb_publish_tensors(store, S("team/a"), ad.t, 4, NULL, NULL, &err),
             LORADB_INVALID_ARGUMENT);
  CHECK(err != NULL && strstr(err, "k_proj") != NULL);
  loradb_free(err);
  /* wrong struct_size */
  make_adapter(&ad, 1.0f);
  info.struct_size = sizeof(info) - 8;
  CHECK_CODE(loradb_publish_tensors(store, S("team/a"), ad.t, 4, NULL, &info, &err),
             LORADB_INVALID_ARGUMENT);
  CHECK(err != NULL && strstr(err, "struct_size") != NULL);
  loradb_free(err);
  {
    loradb_publish_options_t opts;
    memset(&opts, 0, sizeof(opts));
    opts.struct_size = 3;
    CHECK_CODE(loradb_publish_tensors(store, S("team/a"), ad.t, 4, &opts, NULL, NULL),
               LORADB_INVALID_ARGUMENT);
  }
  /* Nothing was published by the failures. */
  info = info_init();
  CHECK_CODE(loradb_revision_resolve(store, S("team/a:latest"), &info, NULL), LORADB_NOT_FOUND);

  id = publish(store, 1.0f, "serving");
  CHECK(id > 0);
  CHECK_CODE(loradb_revision_get(store, id, &info, NULL), LORADB_OK);
  CHECK(info.seq == 1 && info.tensor_count == 4 && info.lora_r == 2 && info.deleted == 0);
  CHECK(strlen(info.blob_hash) == 32);
  info.struct_size = 0;
  CHECK_CODE(loradb_revision_get(store, id, &info, NULL), LORADB_INVALID_ARGUMENT);
  info = info_init();
  CHECK_CODE(loradb_revision_get(store, id + 1000, &info, NULL), LORADB_NOT_FOUND);
  CHECK_CODE(loradb_revision_resolve(store, S("team/a:serving"), &info, NULL), LORADB_OK);
  CHECK(info.id == id);
  CHECK_CODE(loradb_revision_resolve(store, S("team/a@1"), &info, NULL), LORADB_OK);
  CHECK(info.id == id);
  CHECK_CODE(loradb_revision_resolve(store, S("???"), &info, NULL), LORADB_INVALID_ARGUMENT);

  CHECK_CODE(loradb_revision_read_tensors(store, id, &tensors, &err), LORADB_OK);
  CHECK(loradb_tensors_count(tensors) == 4);
  memset(&view, 0, sizeof(view));
  view.struct_size = sizeof(view);
  CHECK_CODE(loradb_tensors_find(tensors, ad.t[1].name, ad.t[1].name_len, &view), LORADB_OK);
  CHECK(view.dtype == LORADB_DTYPE_F32 && view.ndim == 2 && view.shape[0] == 16);
  CHECK(view.nbytes == sizeof(ad.b_q) && memcmp(view.data, ad.b_q, view.nbytes) == 0);
  for (i = 0; i < 4; ++i) CHECK_CODE(loradb_tensors_at(tensors, i, &view), LORADB_OK);
  CHECK_CODE(loradb_tensors_at(tensors, 4, &view), LORADB_OUT_OF_RANGE);
  CHECK_CODE(loradb_tensors_find(tensors, S("nope"), &view), LORADB_NOT_FOUND);
  view.struct_size = 1;
  CHECK_CODE(loradb_tensors_at(tensors, 0, &view), LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_tensors_at(NULL, 0, &view), LORADB_INVALID_ARGUMENT);
  /* Tensors outlive the store they were read from. */
  CHECK_CODE(loradb_close(&store), LORADB_OK);
  view.struct_size = sizeof(view);
  CHECK_CODE(loradb_tensors_at(tensors, 0, &view), LORADB_OK);
  stale = tensors;
  CHECK_CODE(loradb_tensors_destroy(&tensors), LORADB_OK);
  CHECK(tensors == NULL);
  CHECK_CODE(loradb_tensors_destroy(&tensors), LORADB_OK);
  CHECK_CODE(loradb_tensors_destroy(&stale), LORADB_INVALID_HANDLE);
  CHECK(loradb_tensors_count(stale) == 0);
  CHECK_CODE(loradb_tensors_at(stale, 0, &view), LORADB_INVALID_HANDLE);
  CHECK_CODE(loradb_tensors_destroy(NULL), LORADB_INVALID_ARGUMENT);
}

static void test_list_aliases_rollback_delete(void) {
  loradb_store_t* store = open_fixture();
  loradb_revision_info_t page[2];
  size_t count = 0;
  uint64_t next = 0, ids[3], now = 0;
  char* json = NULL;
  char* err = NULL;
  ids[0] = publish(store, 1.0f, "serving");
  ids[1] = publish(store, 2.0f, NULL);
  ids[2] = publish(store, 3.0f, NULL);
  page[0] = info_init();
  page[1] = info_init();
  CHECK_CODE(loradb_revision_list(store, S("team/a"), 0, page, 2, &count, &next, NULL), LORADB_OK);
  CHECK(count == 2 && page[0].id == ids[0] && page[1].id == ids[1] && next == 2);
  CHECK_CODE(loradb_revision_list(store, S("team/a"), next, page, 2, &count, &next, NULL),
             LORADB_OK);
  CHECK(count == 1 && page[0].id == ids[2] && next == 0);
  page[1].struct_size = 5;
  CHECK_CODE(loradb_revision_list(store, S("team/a"), 0, page, 2, &count, &next, NULL),
             LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_revision_list(store, S("team/a"), 0, page, 0, &count, &next, NULL),
             LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_revision_list(store, S("team/zz"), 0, page, 1, &count, &next, NULL),
             LORADB_NOT_FOUND);

  CHECK_CODE(loradb_alias_set(store, S("team/a"), S("serving"), ids[2], S("promote"), NULL),
             LORADB_OK);
  CHECK_CODE(loradb_alias_set(store, S("team/a"), S("bad alias"), ids[2], NULL, 0, NULL),
             LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_alias_set(store, S("team/a"), S("serving"), 999999, NULL, 0, &err),
             LORADB_NOT_FOUND);
  loradb_free(err);
  CHECK_CODE(loradb_revision_delete(store, ids[2], &err), LORADB_CONFLICT);
  CHECK(err != NULL);
  loradb_free(err);
  CHECK_CODE(loradb_alias_history(store, S("team/a"), S("serving"), &json, NULL, NULL), LORADB_OK);
  CHECK(json != NULL && strstr(json, "promote") != NULL);
  loradb_free(json);
  CHECK_CODE(loradb_alias_rollback(store, S("team/a"), S("serving"), &now, NULL), LORADB_OK);
  CHECK(now == ids[0]);
  CHECK_CODE(loradb_revision_delete(store, ids[2], NULL), LORADB_OK);
  CHECK_CODE(loradb_revision_delete(store, ids[2], NULL), LORADB_CONFLICT);
  CHECK_CODE(loradb_revision_delete(store, 424242, NULL), LORADB_NOT_FOUND);
  {
    loradb_located_t loc;
    memset(&loc, 0, sizeof(loc));
    loc.struct_size = sizeof(loc);
    CHECK_CODE(loradb_locate(store, S("team/a"), S("serving"), &loc, NULL), LORADB_OK);
    CHECK(loc.revision_id == ids[0] && loc.tier == LORADB_TIER_STORAGE);
    CHECK(loc.base_name != NULL && strcmp(loc.base_name, "tiny") == 0);
    CHECK(loc.blob_path != NULL && access(loc.blob_path, R_OK) == 0);
    loradb_free(loc.base_name);
    loradb_free(loc.blob_path);
    loc.struct_size = 0;
    CHECK_CODE(loradb_locate(store, S("team/a"), S("serving"), &loc, NULL),
               LORADB_INVALID_ARGUMENT);
    loc.struct_size = sizeof(loc);
    CHECK_CODE(loradb_locate(store, S("team/a"), S("canary"), &loc, NULL), LORADB_NOT_FOUND);
  }
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void test_checkpoints_verify_export_reimport(void) {
  loradb_store_t* store = open_fixture();
  adapter_t ad;
  loradb_checkpoint_info_t ck;
  loradb_revision_info_t info = info_init();
  char dir[512];
  char file[600];
  char* report = NULL;
  int ok = 0;
  uint64_t id = publish(store, 5.0f, "serving");
  make_adapter(&ad, 9.0f);
  memset(&ck, 0, sizeof(ck));
  ck.struct_size = sizeof(ck);
  CHECK_CODE(loradb_checkpoint_put(store, S("team/a"), 10, 0, ad.t, 2, ad.t + 2, 2, NULL, 0,
                                   S("cosine"), 10, "rng", 3, NULL, 0, &ck, NULL),
             LORADB_OK);
  CHECK(ck.id > 0 && ck.step == 10 && ck.master_bytes > 0 && ck.optimizer_bytes > 0);
  {
    loradb_checkpoint_info_t got;
    memset(&got, 0, sizeof(got));
    got.struct_size = sizeof(got);
    CHECK_CODE(loradb_checkpoint_get(store, ck.id, &got, NULL), LORADB_OK);
    CHECK(got.step == 10 && got.scheduler_position == 10);
    CHECK_CODE(loradb_checkpoint_get(store, ck.id + 77, &got, NULL), LORADB_NOT_FOUND);
  }
  CHECK_CODE(loradb_checkpoint_put(store, S("team/a"), 11, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0,
                                   NULL, 0, NULL, 0, NULL, NULL),
             LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_checkpoint_put(store, S("team/a"), 11, 0, ad.t, 2, NULL, 0, NULL, 0, NULL, 0, 0,
                                   NULL, 5, NULL, 0, NULL, NULL),
             LORADB_INVALID_ARGUMENT);

  CHECK_CODE(loradb_verify(store, &ok, &report, NULL, NULL), LORADB_OK);
  CHECK(ok == 1 && report != NULL && strstr(report, "\"ok\":true") != NULL);
  loradb_free(report);
  CHECK_CODE(loradb_verify(store, NULL, NULL, NULL, NULL), LORADB_INVALID_ARGUMENT);

  path_in_tmp("export", dir, sizeof(dir));
  CHECK_CODE(loradb_revision_export_peft(store, id, dir, strlen(dir), NULL), LORADB_OK);
  snprintf(file, sizeof(file), "%s/adapter_model.safetensors", dir);
  CHECK(access(file, R_OK) == 0);
  CHECK_CODE(loradb_publish_peft_dir(store, S("team/a"), dir, strlen(dir), NULL, &info, NULL),
             LORADB_OK);
  CHECK(info.seq == 2 && info.tensor_count == 4 && info.lora_r == 2);
  CHECK_CODE(loradb_publish_safetensors(store, S("team/a"), file, strlen(file), NULL, &info, NULL),
             LORADB_OK);
  CHECK(info.seq == 3);
  CHECK_CODE(loradb_publish_peft_dir(store, S("team/a"), S("/nonexistent/dir"), NULL, NULL, NULL),
             LORADB_NOT_FOUND);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

/* Calls loradb_publish_peft_dir (call 0) or loradb_publish_safetensors (call 1). */
static loradb_status_t publish_from(int call, loradb_store_t* store, const char* policy,
                                    size_t policy_len, const char* src, size_t src_len,
                                    const loradb_publish_options_t* opts,
                                    loradb_revision_info_t* out, char** err) {
  return call == 0
             ? loradb_publish_peft_dir(store, policy, policy_len, src, src_len, opts, out, err)
             : loradb_publish_safetensors(store, policy, policy_len, src, src_len, opts, out, err);
}

/* The checks the three publish calls share, for the two that import from a file: store handle,
 * policy, the path, `out`'s struct_size, the options; each failure names what was wrong and
 * publishes nothing. */
/* Per-expert LoRA (no PEFT config stored) on a qwen3_moe base's experts: the default export
 * refuses it with LORADB_CONFLICT and leaves no files; the per-expert layout writes it; an unknown
 * layout is an invalid argument. */
static void test_export_layouts_of_per_expert_moe_lora(void) {
  static const char kConfig[] =
      "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 32, \"hidden_size\": 8,"
      " \"intermediate_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
      " \"num_key_value_heads\": 1, \"head_dim\": 4, \"num_experts\": 2,"
      " \"num_experts_per_tok\": 1, \"moe_intermediate_size\": 4, \"tie_word_embeddings\": true}";
  static float a[2][16], b[2][8];
  static const int64_t shape_a[2] = {2, 8}, shape_b[2] = {4, 2};
  const char* names[4] = {"base_model.model.model.layers.0.mlp.experts.0.up_proj.lora_A.weight",
                          "base_model.model.model.layers.0.mlp.experts.0.up_proj.lora_B.weight",
                          "base_model.model.model.layers.0.mlp.experts.1.up_proj.lora_A.weight",
                          "base_model.model.model.layers.0.mlp.experts.1.up_proj.lora_B.weight"};
  loradb_tensor_t t[4];
  loradb_store_t* store = NULL;
  loradb_revision_info_t info = info_init();
  char path[512], config[512], dir[512], file[600];
  char* err = NULL;
  size_t i;
  FILE* f;
  for (i = 0; i < 16; ++i) a[0][i] = a[1][i] = 0.5f + (float)i;
  for (i = 0; i < 8; ++i) b[0][i] = b[1][i] = 1.0f - (float)i;
  memset(t, 0, sizeof(t));
  for (i = 0; i < 4; ++i) {
    t[i].name = names[i];
    t[i].name_len = strlen(names[i]);
    t[i].dtype = LORADB_DTYPE_F32;
    t[i].shape = i % 2 == 0 ? shape_a : shape_b;
    t[i].ndim = 2;
    t[i].data = i % 2 == 0 ? (const void*)a[i / 2] : (const void*)b[i / 2];
    t[i].nbytes = i % 2 == 0 ? sizeof(a[0]) : sizeof(b[0]);
  }
  f = fopen(path_in_tmp("moe-config.json", config, sizeof(config)), "w");
  CHECK(f != NULL);
  fputs(kConfig, f);
  fclose(f);
  path_in_tmp("moe-store", path, sizeof(path));
  CHECK_CODE(loradb_open(path, strlen(path), NULL, &store, NULL), LORADB_OK);
  CHECK_CODE(loradb_base_add_config(store, S("moe"), config, strlen(config), NULL, 0, &err),
             LORADB_OK);
  if (err != NULL) fprintf(stderr, "  base: %s\n", err);
  loradb_free(err);
  err = NULL;
  CHECK_CODE(loradb_policy_create(store, S("team/moe"), S("moe"), NULL, 0, NULL, NULL), LORADB_OK);
  CHECK_CODE(loradb_publish_tensors(store, S("team/moe"), t, 4, NULL, &info, &err), LORADB_OK);
  if (err != NULL) fprintf(stderr, "  publish: %s\n", err);
  loradb_free(err);
  err = NULL;

  path_in_tmp("moe-export", dir, sizeof(dir));
  snprintf(file, sizeof(file), "%s/adapter_model.safetensors", dir);
  CHECK_CODE(loradb_revision_export_peft(store, info.id, dir, strlen(dir), &err), LORADB_CONFLICT);
  CHECK(err != NULL && strstr(err, "--layout per-expert") != NULL);
  loradb_free(err);
  err = NULL;
  CHECK(access(file, F_OK) != 0);
  CHECK_CODE(loradb_revision_export_peft_layout(store, info.id, dir, strlen(dir),
                                                LORADB_PEFT_LAYOUT_PER_EXPERT, NULL),
             LORADB_OK);
  CHECK(access(file, R_OK) == 0);
  CHECK_CODE(loradb_revision_export_peft_layout(store, info.id, dir, strlen(dir),
                                                (loradb_peft_layout_t)7, NULL),
             LORADB_INVALID_ARGUMENT);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

static void test_publish_from_file_misuse(void) {
  loradb_store_t* store = open_fixture();
  loradb_store_t* stale = NULL;
  loradb_revision_info_t info = info_init();
  loradb_publish_options_t opts;
  char* err = NULL;
  int call;
  memset(&opts, 0, sizeof(opts));
  opts.struct_size = sizeof(opts);
  for (call = 0; call < 2; ++call) {
    CHECK_CODE(publish_from(call, NULL, S("team/a"), S("/x"), NULL, NULL, &err),
               LORADB_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(err, "store handle") != NULL);
    loradb_free(err);
    CHECK_CODE(publish_from(call, store, NULL, 3, S("/x"), NULL, NULL, &err),
               LORADB_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(err, "policy is NULL") != NULL);
    loradb_free(err);
    CHECK_CODE(publish_from(call, store, S("team/a"), NULL, 2, NULL, NULL, &err),
               LORADB_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(err, call == 0 ? "dir is NULL" : "path is NULL") != NULL);
    loradb_free(err);
    /* The path is checked before `out`, `out` before the options. */
    info.struct_size = 1;
    CHECK_CODE(publish_from(call, store, S("team/a"), NULL, 2, NULL, &info, &err),
               LORADB_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(err, "NULL with a non-zero length") != NULL);
    loradb_free(err);
    opts.struct_size = 5;
    CHECK_CODE(publish_from(call, store, S("team/a"), S("/x"), &opts, &info, &err),
               LORADB_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(err, "out->struct_size") != NULL);
    loradb_free(err);
    info = info_init();
    CHECK_CODE(publish_from(call, store, S("team/a"), S("/x"), &opts, &info, &err),
               LORADB_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(err, "options->struct_size") != NULL);
    loradb_free(err);
    opts.struct_size = sizeof(opts);
    opts.alias = NULL;
    opts.alias_len = 4;
    CHECK_CODE(publish_from(call, store, S("team/a"), S("/x"), &opts, &info, &err),
               LORADB_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(err, "options->alias") != NULL);
    loradb_free(err);
    opts.alias_len = 0;
    /* Valid arguments reach the store, which reports the missing source. */
    CHECK_CODE(publish_from(call, store, S("team/a"), S("/nonexistent/source"), &opts, &info, NULL),
               LORADB_NOT_FOUND);
    info = info_init();
    CHECK_CODE(loradb_revision_resolve(store, S("team/a:latest"), &info, NULL), LORADB_NOT_FOUND);
  }
  stale = store;
  CHECK_CODE(loradb_close(&store), LORADB_OK);
  for (call = 0; call < 2; ++call) {
    CHECK_CODE(publish_from(call, stale, S("team/a"), S("/x"), NULL, NULL, &err),
               LORADB_INVALID_HANDLE);
    CHECK(err != NULL && strstr(err, "closed") != NULL);
    loradb_free(err);
  }
}

/* Several threads share one store handle: each publishes revisions to its own policy and reads
 * them back (tensors included) while the others do the same. */
typedef struct {
  loradb_store_t* store;
  int index;
  int failures;
} worker_t;

static void* worker_main(void* arg) {
  worker_t* w = (worker_t*)arg;
  char policy[32];
  int i;
  snprintf(policy, sizeof(policy), "team/w%d", w->index);
  if (loradb_policy_create(w->store, policy, strlen(policy), S("tiny"), NULL, 0, NULL, NULL) !=
      LORADB_OK) {
    ++w->failures;
    return NULL;
  }
  for (i = 0; i < 10; ++i) {
    adapter_t ad;
    loradb_revision_info_t info = info_init();
    loradb_revision_info_t got = info_init();
    loradb_tensors_t* t = NULL;
    loradb_tensor_view_t view;
    make_adapter(&ad, (float)(w->index * 100 + i));
    if (loradb_publish_tensors(w->store, policy, strlen(policy), ad.t, 4, NULL, &info, NULL) !=
            LORADB_OK ||
        loradb_revision_get(w->store, info.id, &got, NULL) != LORADB_OK ||
        got.seq != (uint64_t)(i + 1) ||
        loradb_revision_read_tensors(w->store, info.id, &t, NULL) != LORADB_OK) {
      ++w->failures;
      continue;
    }
    memset(&view, 0, sizeof(view));
    view.struct_size = sizeof(view);
    if (loradb_tensors_find(t, ad.t[0].name, ad.t[0].name_len, &view) != LORADB_OK ||
        memcmp(view.data, ad.a_q, sizeof(ad.a_q)) != 0) {
      ++w->failures;
    }
    loradb_tensors_destroy(&t);
  }
  return NULL;
}

static void test_threads_share_one_store(void) {
  loradb_store_t* store = open_fixture();
  pthread_t threads[4];
  worker_t workers[4];
  int i;
  for (i = 0; i < 4; ++i) {
    workers[i].store = store;
    workers[i].index = i;
    workers[i].failures = 0;
    CHECK(pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0);
  }
  for (i = 0; i < 4; ++i) {
    CHECK(pthread_join(threads[i], NULL) == 0);
    CHECK(workers[i].failures == 0);
  }
  {
    int ok = 0;
    CHECK_CODE(loradb_verify(store, &ok, NULL, NULL, NULL), LORADB_OK);
    CHECK(ok == 1);
  }
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

/* 8 threads x 40 moves of one alias: every move commits, and verify (the same checks as
 * `loradb verify`, alias log included) passes: the log's order is the commit order, whatever the
 * wall clock says. */
typedef struct {
  loradb_store_t* store;
  const uint64_t* ids;
  int index;
  int failures;
} mover_t;

static void* mover_main(void* arg) {
  mover_t* m = (mover_t*)arg;
  int i;
  for (i = 0; i < 40; ++i) {
    if (loradb_alias_set(m->store, S("team/a"), S("serving"), m->ids[(m->index + i) % 4], S("race"),
                         NULL) != LORADB_OK) {
      ++m->failures;
    }
  }
  return NULL;
}

static void test_concurrent_alias_moves_then_verify(void) {
  loradb_store_t* store = open_fixture();
  uint64_t ids[4];
  pthread_t threads[8];
  mover_t movers[8];
  char* json = NULL;
  char* report = NULL;
  int i, ok = 0;
  ids[0] = publish(store, 1.0f, "serving");
  ids[1] = publish(store, 2.0f, NULL);
  ids[2] = publish(store, 3.0f, NULL);
  ids[3] = publish(store, 4.0f, NULL);
  for (i = 0; i < 8; ++i) {
    movers[i].store = store;
    movers[i].ids = ids;
    movers[i].index = i;
    movers[i].failures = 0;
    CHECK(pthread_create(&threads[i], NULL, mover_main, &movers[i]) == 0);
  }
  for (i = 0; i < 8; ++i) {
    CHECK(pthread_join(threads[i], NULL) == 0);
    CHECK(movers[i].failures == 0);
  }
  CHECK_CODE(loradb_verify(store, &ok, &report, NULL, NULL), LORADB_OK);
  CHECK(ok == 1);
  if (ok != 1 && report != NULL) fprintf(stderr, "  verify: %s\n", report);
  loradb_free(report);
  /* Entries carry their number in the log (commit order), 1 first. */
  CHECK_CODE(loradb_alias_history(store, S("team/a"), S("serving"), &json, NULL, NULL), LORADB_OK);
  CHECK(json != NULL && strstr(json, "\"seq\":1,") != NULL && strstr(json, "\"seq\":2,") != NULL);
  loradb_free(json);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

/* Malformed references and names are LORADB_INVALID_ARGUMENT with a message naming the problem,
 * never LORADB_INTERNAL. */
static void test_bad_references_and_policy_names(void) {
  loradb_store_t* store = open_fixture();
  loradb_revision_info_t info = info_init();
  char* err = NULL;
  uint64_t id = publish(store, 1.0f, "serving");
  const char* bad_refs[] = {":serving", " 1",        "1 ",      "01",
                            "+1",       "team/a@01", "team/a:", "x//y:serving"};
  const char* bad_names[] = {"a/../b", "a//b", "x/", "/x", "a/./b", ".", "..", "a/.."};
  size_t i;
  CHECK(id == 1);
  CHECK_CODE(loradb_revision_resolve(store, S("1"), &info, NULL), LORADB_OK);
  CHECK(info.id == id);
  CHECK_CODE(loradb_revision_resolve(store, S("team/a:serving"), &info, NULL), LORADB_OK);
  CHECK_CODE(loradb_revision_resolve(store, S("team/a@1"), &info, NULL), LORADB_OK);
  CHECK_CODE(loradb_revision_resolve(store, S(":serving"), &info, &err), LORADB_INVALID_ARGUMENT);
  CHECK(err != NULL && strstr(err, "policy name ''") != NULL);
  loradb_free(err);
  for (i = 0; i < sizeof(bad_refs) / sizeof(bad_refs[0]); ++i) {
    err = NULL;
    CHECK_CODE(loradb_revision_resolve(store, bad_refs[i], strlen(bad_refs[i]), &info, &err),
               LORADB_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(err, "bad revision reference") != NULL);
    loradb_free(err);
  }
  for (i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); ++i) {
    err = NULL;
    CHECK_CODE(loradb_policy_create(store, bad_names[i], strlen(bad_names[i]), S("tiny"), NULL, 0,
                                    NULL, &err),
               LORADB_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(err, bad_names[i]) != NULL);
    loradb_free(err);
    CHECK_CODE(loradb_alias_set(store, bad_names[i], strlen(bad_names[i]), S("serving"), id, NULL,
                                0, NULL),
               LORADB_INVALID_ARGUMENT);
  }
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

/* A regular file where the store directory should be: a clear error, and the file untouched. */
static void test_open_regular_file(void) {
  char path[512];
  loradb_store_t* store = NULL;
  char* err = NULL;
  FILE* f = fopen(path_in_tmp("plain-file", path, sizeof(path)), "w");
  CHECK(f != NULL);
  if (f == NULL) return;
  fputs("not a store", f);
  fclose(f);
  CHECK_CODE(loradb_open(path, strlen(path), NULL, &store, &err), LORADB_INVALID_ARGUMENT);
  CHECK(err != NULL && strstr(err, "is not a store directory") != NULL);
  loradb_free(err);
  CHECK(store == NULL);
}

/* Run with LORADB_FAULT=catalog.before_commit:eio (ctest api.c_api_eio): the first catalog write
 * fails with a simulated EIO, which reaches C as LORADB_IO_ERROR; nothing of it is committed and
 * the next write succeeds. */
static void test_injected_eio_is_io_error(void) {
  char path[512];
  loradb_store_t* store = NULL;
  char* err = NULL;
  int ok = 0;
  path_in_tmp("eio-store", path, sizeof(path));
  CHECK_CODE(loradb_open(path, strlen(path), NULL, &store, NULL), LORADB_OK);
  CHECK_CODE(loradb_base_add_modules(store, S("tiny"), S(kModules), &err), LORADB_IO_ERROR);
  CHECK(err != NULL && strstr(err, "injected fault at catalog.before_commit") != NULL &&
        strstr(err, "Input/output error") != NULL);
  loradb_free(err);
  CHECK_CODE(loradb_base_list(store, &err, NULL, NULL), LORADB_OK);
  CHECK(err != NULL && strstr(err, "tiny") == NULL); /* not committed */
  loradb_free(err);
  CHECK_CODE(loradb_base_add_modules(store, S("tiny"), S(kModules), NULL), LORADB_OK);
  CHECK_CODE(loradb_verify(store, &ok, NULL, NULL, NULL), LORADB_OK);
  CHECK(ok == 1);
  CHECK_CODE(loradb_close(&store), LORADB_OK);
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "eio") == 0) {
    make_tmp();
    run_test("injected_eio_is_io_error", test_injected_eio_is_io_error);
    remove_tmp();
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
  }
  make_tmp();
  run_test("version_and_status_names", test_version_and_status_names);
  run_test("open_misuse_and_options", test_open_misuse_and_options);
  run_test("null_and_closed_store_handles", test_null_and_closed_store_handles);
  remove_tmp();
  make_tmp();
  run_test("bases_and_policies", test_bases_and_policies);
  remove_tmp();
  make_tmp();
  run_test("publish_read_and_wrong_sizes", test_publish_read_and_wrong_sizes);
  remove_tmp();
  make_tmp();
  run_test("list_aliases_rollback_delete", test_list_aliases_rollback_delete);
  remove_tmp();
  make_tmp();
  run_test("checkpoints_verify_export_reimport", test_checkpoints_verify_export_reimport);
  remove_tmp();
  make_tmp();
  run_test("export_layouts_of_per_expert_moe_lora", test_export_layouts_of_per_expert_moe_lora);
  remove_tmp();
  make_tmp();
  run_test("publish_from_file_misuse", test_publish_from_file_misuse);
  remove_tmp();
  make_tmp();
  run_test("threads_share_one_store", test_threads_share_one_store);
  remove_tmp();
  make_tmp();
  run_test("concurrent_alias_moves_then_verify", test_concurrent_alias_moves_then_verify);
  remove_tmp();
  make_tmp();
  run_test("bad_references_and_policy_names", test_bad_references_and_policy_names);
  run_test("open_regular_file", test_open_regular_file);
  remove_tmp();
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
