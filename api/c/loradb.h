/*
 * loradb C API (C11): embed the loradb adapter store in any language with a C FFI.
 *
 * Conventions
 *  - Every fallible function returns a loradb_status_t. LORADB_OK (0) is success.
 *  - `errmsg` (optional, may be NULL) receives a NUL-terminated message on failure, allocated by
 *    the library; free it with loradb_free(). On success *errmsg is set to NULL.
 *  - Byte strings (names, paths, JSON) are passed as pointer + length and need not be
 *    NUL-terminated; a NULL pointer with length 0 is the empty string.
 *  - Strings and buffers the library returns are allocated by it and freed with loradb_free().
 *  - Handles are opaque. Destroy functions take a pointer to the handle and set it to NULL;
 *    destroying a NULL handle is a no-op returning LORADB_OK. A handle that was already
 *    destroyed (a stale copy) is detected where possible and refused with LORADB_INVALID_HANDLE;
 *    using it is never required to crash, but freed memory reused by a new handle cannot be told
 *    apart, so do not rely on the check.
 *  - Structs filled by the library start with `struct_size`: set it to sizeof(the struct) before
 *    the call; a different value is LORADB_INVALID_ARGUMENT (this catches header/library
 *    mismatches and wrong pointers).
 *
 * Thread safety
 *  - loradb_store_t is thread-safe: any number of threads may call functions on one store at
 *    once, except loradb_close, which must not race with any other call on that store.
 *  - loradb_tensors_t is immutable after creation: concurrent reads are safe; destroy it from one
 *    thread once no other thread uses it. Tensor views stay valid until it is destroyed.
 *  - loradb_options_t is not thread-safe (build it on one thread, then pass it to loradb_open).
 *  - Functions without a handle (loradb_version, loradb_status_name, loradb_free) are
 *    thread-safe.
 */
#ifndef LORADB_API_C_LORADB_H_
#define LORADB_API_C_LORADB_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define LORADB_EXPORT __attribute__((visibility("default")))
#else
#define LORADB_EXPORT
#endif

/* Return codes. Stable values: new codes are only ever appended. */
typedef enum loradb_status_t {
  LORADB_OK = 0,
  LORADB_INVALID_ARGUMENT = 1,   /* bad input: NULL pointer, bad name, wrong size, bad JSON */
  LORADB_NOT_FOUND = 2,          /* no such store, base, policy, revision, alias, checkpoint */
  LORADB_ALREADY_EXISTS = 3,     /* name taken */
  LORADB_CONFLICT = 4,           /* state forbids it: aliased revision, archived policy, ... */
  LORADB_RESOURCE_EXHAUSTED = 5, /* a budget or queue is full; retry later */
  LORADB_UNAVAILABLE = 6,        /* temporarily unavailable */
  LORADB_IO_ERROR = 7,           /* reading or writing files failed */
  LORADB_CORRUPT = 8,            /* checksum mismatch or damaged data */
  LORADB_INTERNAL = 9,           /* a bug in loradb */
  LORADB_UNIMPLEMENTED = 10,     /* not supported (e.g. an unsupported PEFT feature) */
  LORADB_INVALID_HANDLE = 11,    /* a destroyed (closed) or foreign handle */
  LORADB_OUT_OF_RANGE = 12       /* an index past the end */
} loradb_status_t;

/* Tensor element types (the safetensors dtypes). */
typedef enum loradb_dtype_t {
  LORADB_DTYPE_BOOL = 0,
  LORADB_DTYPE_U8 = 1,
  LORADB_DTYPE_I8 = 2,
  LORADB_DTYPE_I16 = 3,
  LORADB_DTYPE_U16 = 4,
  LORADB_DTYPE_I32 = 5,
  LORADB_DTYPE_U32 = 6,
  LORADB_DTYPE_I64 = 7,
  LORADB_DTYPE_U64 = 8,
  LORADB_DTYPE_F16 = 9,
  LORADB_DTYPE_BF16 = 10,
  LORADB_DTYPE_F32 = 11,
  LORADB_DTYPE_F64 = 12,
  LORADB_DTYPE_F8_E4M3 = 13,
  LORADB_DTYPE_F8_E5M2 = 14
} loradb_dtype_t;

/* Where a revision's bytes are. */
typedef enum loradb_tier_t {
  LORADB_TIER_STORAGE = 0,
  LORADB_TIER_CPU = 1,
  LORADB_TIER_GPU = 2
} loradb_tier_t;

typedef struct loradb_store_t loradb_store_t;
typedef struct loradb_options_t loradb_options_t;
typedef struct loradb_tensors_t loradb_tensors_t;

/* A revision's metadata. Set struct_size = sizeof(loradb_revision_info_t) before a call. */
typedef struct loradb_revision_info_t {
  size_t struct_size;
  uint64_t id;        /* global revision id */
  uint64_t policy_id; /* the policy's numeric id */
  uint64_t seq;       /* per-policy sequence number, from 1 */
  uint64_t parent;    /* 0: none */
  uint64_t blob_bytes;
  uint32_t tensor_count;
  int32_t lora_r;
  float lora_alpha;
  int use_rslora;         /* 0 or 1 */
  int deleted;            /* 0 live, 1 deleted */
  int packed;             /* 0 plain layout, 1 packed */
  int trained;            /* 0 imported, 1 trained */
  uint64_t checkpoint_id; /* trained: the checkpoint it was exported from */
  int64_t created_us;     /* microseconds since the Unix epoch */
  char blob_hash[33];     /* xxh3-128 of the blob, 32 hex digits + NUL */
} loradb_revision_info_t;

/* A checkpoint's metadata. Set struct_size = sizeof(loradb_checkpoint_info_t) before a call. */
typedef struct loradb_checkpoint_info_t {
  size_t struct_size;
  uint64_t id;
  uint64_t policy_id;
  uint64_t step;
  uint64_t parent;
  uint64_t master_bytes;
  uint64_t optimizer_bytes;
  uint64_t gradients_bytes;
  int64_t scheduler_position;
  int64_t created_us;
} loradb_checkpoint_info_t;

/* Store::Locate's four answers. Set struct_size before the call; `base_name` and `blob_path`
 * are allocated by the library: free each with loradb_free(). */
typedef struct loradb_located_t {
  size_t struct_size;
  char* base_name;        /* which base can run the revision */
  uint64_t checkpoint_id; /* which checkpoint restores its training (0: none) */
  uint64_t revision_id;   /* which revision the alias serves */
  loradb_tier_t tier;     /* where the bytes are now */
  char* blob_path;        /* the blob file */
  uint64_t bytes;
} loradb_located_t;

/* A tensor handed to loradb_publish_tensors (the caller owns the memory). `nbytes` must equal
 * the product of `shape` times the element size. PEFT names, e.g.
 * "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight". */
typedef struct loradb_tensor_t {
  const char* name;
  size_t name_len;
  loradb_dtype_t dtype;
  const int64_t* shape;
  size_t ndim;
  const void* data;
  size_t nbytes;
} loradb_tensor_t;

/* A view of one tensor inside a loradb_tensors_t; valid until that handle is destroyed.
 * `name` is not NUL-terminated (use name_len). */
typedef struct loradb_tensor_view_t {
  size_t struct_size;
  const char* name;
  size_t name_len;
  loradb_dtype_t dtype;
  const int64_t* shape;
  size_t ndim;
  const void* data;
  size_t nbytes;
} loradb_tensor_view_t;

/* Options for publishing a revision. Zero-initialise, then set what you need. */
typedef struct loradb_publish_options_t {
  size_t struct_size; /* sizeof(loradb_publish_options_t) */
  const char* alias;  /* moved to the new revision in the same transaction; may be NULL */
  size_t alias_len;
  uint64_t parent;  /* 0: none */
  int32_t lora_r;   /* tensors/safetensors: rank (0: inferred from the tensors) */
  float lora_alpha; /* tensors/safetensors: alpha (0: same as r) */
  int use_rslora;   /* tensors/safetensors: 1 to scale by alpha/sqrt(r) */
} loradb_publish_options_t;

/* ---- library ------------------------------------------------------------------------------ */

/* "MAJOR.MINOR.PATCH" of the library. Static string; never fails; thread-safe. */
LORADB_EXPORT const char* loradb_version(void);

/* A static name for a status ("LORADB_NOT_FOUND"); "LORADB_UNKNOWN_STATUS" for other values.
 * Never fails; thread-safe. */
LORADB_EXPORT const char* loradb_status_name(loradb_status_t status);

/* Frees memory the library allocated (messages, JSON, strings). NULL is a no-op. Thread-safe. */
LORADB_EXPORT void loradb_free(void* ptr);

/* ---- options ------------------------------------------------------------------------------ */

/* Creates options with defaults (create_if_missing = 1, blob root = <dir>/blobs, durable
 * commits). Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out is NULL). */
LORADB_EXPORT loradb_status_t loradb_options_create(loradb_options_t** out);

/* Destroys options and sets *options to NULL. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT
 * (options is NULL); LORADB_INVALID_HANDLE (already destroyed). */
LORADB_EXPORT loradb_status_t loradb_options_destroy(loradb_options_t** options);

/* 1: create the store when missing; 0: opening a missing store is LORADB_NOT_FOUND.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (value not 0/1); LORADB_INVALID_HANDLE. */
LORADB_EXPORT loradb_status_t loradb_options_set_create_if_missing(loradb_options_t* options,
                                                                   int value);

/* Where blob files live (may be shared storage); empty: <dir>/blobs.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (path NULL with non-zero length);
 * LORADB_INVALID_HANDLE. */
LORADB_EXPORT loradb_status_t loradb_options_set_blob_root(loradb_options_t* options,
                                                           const char* path, size_t path_len);

/* 1: catalog commits are not fsynced (benchmarks only; not crash-safe).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (value not 0/1); LORADB_INVALID_HANDLE. */
LORADB_EXPORT loradb_status_t loradb_options_set_no_sync(loradb_options_t* options, int value);

/* ---- store -------------------------------------------------------------------------------- */

/* Opens (or creates) the store in directory `dir`. `options` may be NULL (defaults).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out or dir NULL, empty dir);
 * LORADB_INVALID_HANDLE (destroyed options); LORADB_NOT_FOUND (missing and not created);
 * LORADB_CONFLICT (written by a newer schema version, or opened across fork());
 * LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_open(const char* dir, size_t dir_len,
                                          const loradb_options_t* options, loradb_store_t** out,
                                          char** errmsg);

/* Closes the store and sets *store to NULL. Must not race with other calls on the store; a
 * loradb_tensors_t read from it stays valid after close. Returns: LORADB_OK (also when *store
 * is NULL); LORADB_INVALID_ARGUMENT (store is NULL); LORADB_INVALID_HANDLE (already closed). */
LORADB_EXPORT loradb_status_t loradb_close(loradb_store_t** store);

/* ---- bases -------------------------------------------------------------------------------- */

/* Registers a base from an explicit module table, JSON:
 * {"modules": [{"name": "layers.0.self_attn.q_proj", "in": 2048, "out": 4096}, ...]}.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (bad name or table); LORADB_ALREADY_EXISTS;
 * LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_base_add_modules(loradb_store_t* store, const char* name,
                                                      size_t name_len, const char* modules_json,
                                                      size_t modules_json_len, char** errmsg);

/* Registers a base from a Hugging Face config.json (Qwen3 family); `weights` (may be empty) is
 * a safetensors file or index whose tensor bytes are fingerprinted.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_ALREADY_EXISTS; LORADB_NOT_FOUND (file
 * missing); LORADB_IO_ERROR; LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_base_add_config(loradb_store_t* store, const char* name,
                                                     size_t name_len, const char* config_path,
                                                     size_t config_path_len, const char* weights,
                                                     size_t weights_len, char** errmsg);

/* Every base as a JSON array of {"name", "family", "module_count"} in *json (free with
 * loradb_free), its length in *json_len (may be NULL).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (json NULL); LORADB_INVALID_HANDLE;
 * LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_base_list(loradb_store_t* store, char** json, size_t* json_len,
                                               char** errmsg);

/* ---- policies ----------------------------------------------------------------------------- */

/* Creates a policy bound to a base. `labels_json` (may be empty) is a JSON object of strings.
 * *policy_id (may be NULL) receives the new id.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (bad name/labels); LORADB_NOT_FOUND (base);
 * LORADB_ALREADY_EXISTS; LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_policy_create(loradb_store_t* store, const char* name,
                                                   size_t name_len, const char* base,
                                                   size_t base_len, const char* labels_json,
                                                   size_t labels_json_len, uint64_t* policy_id,
                                                   char** errmsg);

/* Archives (archived = 1) or unarchives (0) a policy; archived policies accept no new revisions
 * or alias moves. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_NOT_FOUND;
 * LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_policy_archive(loradb_store_t* store, const char* name,
                                                    size_t name_len, int archived, char** errmsg);

/* Policies in id order with id > after_id, at most `limit` (1..1000), as a JSON array of
 * {"id", "name", "base", "archived", "next_seq"}. *next_cursor (may be NULL) receives the id to
 * pass as after_id for the next page, or 0 when there is none.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (json NULL, limit out of range);
 * LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_policy_list(loradb_store_t* store, uint64_t after_id,
                                                 size_t limit, char** json, size_t* json_len,
                                                 uint64_t* next_cursor, char** errmsg);

/* ---- publishing --------------------------------------------------------------------------- */

/* Publishes a revision from caller-owned tensors (copied; crash-safe: the blob is durable
 * before the catalog commit). `options` may be NULL. `out` (may be NULL) receives the revision.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (NULL tensors with count > 0, nbytes not matching
 * shape and dtype, names or shapes incompatible with the base, bad alias, wrong struct_size);
 * LORADB_NOT_FOUND (policy); LORADB_CONFLICT (archived policy); LORADB_IO_ERROR;
 * LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_publish_tensors(loradb_store_t* store, const char* policy,
                                                     size_t policy_len,
                                                     const loradb_tensor_t* tensors,
                                                     size_t tensor_count,
                                                     const loradb_publish_options_t* options,
                                                     loradb_revision_info_t* out, char** errmsg);

/* Imports a PEFT directory (adapter_config.json + adapter_model.safetensors); LoRA settings come
 * from the config (options' lora fields are ignored). Returns: as loradb_publish_tensors, plus
 * LORADB_UNIMPLEMENTED for unsupported PEFT features (DoRA, modules_to_save, ...). */
LORADB_EXPORT loradb_status_t loradb_publish_peft_dir(loradb_store_t* store, const char* policy,
                                                      size_t policy_len, const char* dir,
                                                      size_t dir_len,
                                                      const loradb_publish_options_t* options,
                                                      loradb_revision_info_t* out, char** errmsg);

/* Imports a safetensors file of PEFT-named LoRA tensors; `options` gives the LoRA settings.
 * Returns: as loradb_publish_tensors. */
LORADB_EXPORT loradb_status_t loradb_publish_safetensors(
    loradb_store_t* store, const char* policy, size_t policy_len, const char* path, size_t path_len,
    const loradb_publish_options_t* options, loradb_revision_info_t* out, char** errmsg);

/* ---- revisions ---------------------------------------------------------------------------- */

/* A revision by id. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out NULL, wrong struct_size);
 * LORADB_NOT_FOUND; LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_revision_get(loradb_store_t* store, uint64_t id,
                                                  loradb_revision_info_t* out, char** errmsg);

/* A revision by reference: "123" (id), "POLICY:ALIAS" or "POLICY@SEQ".
 * Returns: as loradb_revision_get, plus LORADB_INVALID_ARGUMENT for a malformed reference. */
LORADB_EXPORT loradb_status_t loradb_revision_resolve(loradb_store_t* store, const char* ref,
                                                      size_t ref_len, loradb_revision_info_t* out,
                                                      char** errmsg);

/* A policy's live revisions in seq order with seq > after_seq: fills up to `capacity` entries
 * of `out` (each with struct_size set by the caller), *count = entries filled, *next_cursor =
 * the after_seq of the next page or 0 when there is none (may be NULL).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out/count NULL, capacity 0 or > 1000, wrong
 * struct_size); LORADB_NOT_FOUND (policy); LORADB_INVALID_HANDLE; LORADB_IO_ERROR. */
LORADB_EXPORT loradb_status_t loradb_revision_list(loradb_store_t* store, const char* policy,
                                                   size_t policy_len, uint64_t after_seq,
                                                   loradb_revision_info_t* out, size_t capacity,
                                                   size_t* count, uint64_t* next_cursor,
                                                   char** errmsg);

/* Deletes a revision (its blob stays until compaction). Returns: LORADB_OK; LORADB_NOT_FOUND;
 * LORADB_CONFLICT (an alias points at it, or already deleted); LORADB_INVALID_HANDLE;
 * LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_revision_delete(loradb_store_t* store, uint64_t id,
                                                     char** errmsg);

/* Reads a revision's tensors from its blob (checksums verified) into a new handle.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out NULL); LORADB_NOT_FOUND; LORADB_CORRUPT
 * (checksum mismatch); LORADB_IO_ERROR; LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_revision_read_tensors(loradb_store_t* store, uint64_t id,
                                                           loradb_tensors_t** out, char** errmsg);

/* Writes a revision as a PEFT directory (adapter_config.json + adapter_model.safetensors).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_NOT_FOUND; LORADB_IO_ERROR;
 * LORADB_CORRUPT; LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_revision_export_peft(loradb_store_t* store, uint64_t id,
                                                          const char* out_dir, size_t out_dir_len,
                                                          char** errmsg);

/* ---- tensors ------------------------------------------------------------------------------ */

/* Number of tensors; 0 for NULL or destroyed handles. Thread-safe. */
LORADB_EXPORT size_t loradb_tensors_count(const loradb_tensors_t* tensors);

/* The tensor at `index`. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (view NULL, wrong
 * struct_size); LORADB_OUT_OF_RANGE; LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_tensors_at(const loradb_tensors_t* tensors, size_t index,
                                                loradb_tensor_view_t* view);

/* The tensor called `name`. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_NOT_FOUND;
 * LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_tensors_find(const loradb_tensors_t* tensors, const char* name,
                                                  size_t name_len, loradb_tensor_view_t* view);

/* Destroys the handle (views into it become invalid) and sets *tensors to NULL.
 * Returns: LORADB_OK (also when *tensors is NULL); LORADB_INVALID_ARGUMENT (tensors NULL);
 * LORADB_INVALID_HANDLE (already destroyed). */
LORADB_EXPORT loradb_status_t loradb_tensors_destroy(loradb_tensors_t** tensors);

/* ---- aliases ------------------------------------------------------------------------------ */

/* Moves (or creates) `alias` to `revision` (a live revision of the policy) and logs the move;
 * "promote" is setting `serving`. `reason` may be empty.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (bad alias name); LORADB_NOT_FOUND (policy or
 * revision); LORADB_CONFLICT (archived policy, deleted revision, other policy's revision);
 * LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_alias_set(loradb_store_t* store, const char* policy,
                                               size_t policy_len, const char* alias,
                                               size_t alias_len, uint64_t revision,
                                               const char* reason, size_t reason_len,
                                               char** errmsg);

/* Moves `alias` back to its value before its last move; *revision (may be NULL) receives it.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_NOT_FOUND; LORADB_CONFLICT (no earlier
 * value, or it is no longer live); LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_alias_rollback(loradb_store_t* store, const char* policy,
                                                    size_t policy_len, const char* alias,
                                                    size_t alias_len, uint64_t* revision,
                                                    char** errmsg);

/* The alias's move log, oldest first, as a JSON array of
 * {"time_us", "from_revision", "to_revision", "reason"}.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_NOT_FOUND (policy);
 * LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_alias_history(loradb_store_t* store, const char* policy,
                                                   size_t policy_len, const char* alias,
                                                   size_t alias_len, char** json, size_t* json_len,
                                                   char** errmsg);

/* Which base, checkpoint, revision and tier answer (policy, alias). Free out->base_name and
 * out->blob_path with loradb_free. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out NULL, wrong
 * struct_size, bad names); LORADB_NOT_FOUND; LORADB_INVALID_HANDLE; LORADB_IO_ERROR. */
LORADB_EXPORT loradb_status_t loradb_locate(loradb_store_t* store, const char* policy,
                                            size_t policy_len, const char* alias, size_t alias_len,
                                            loradb_located_t* out, char** errmsg);

/* ---- checkpoints -------------------------------------------------------------------------- */

/* Stores a training checkpoint: master adapter weights (required), optimizer moments and
 * accumulated gradients (each may be NULL with count 0), scheduler, RNG state and rollout bytes
 * (may be empty). *out (may be NULL) receives its metadata.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (no master tensors, sizes not matching shapes,
 * wrong struct_size); LORADB_NOT_FOUND (policy); LORADB_IO_ERROR; LORADB_INVALID_HANDLE. */
LORADB_EXPORT loradb_status_t loradb_checkpoint_put(
    loradb_store_t* store, const char* policy, size_t policy_len, uint64_t step, uint64_t parent,
    const loradb_tensor_t* master, size_t master_count, const loradb_tensor_t* optimizer,
    size_t optimizer_count, const loradb_tensor_t* gradients, size_t gradients_count,
    const char* scheduler_name, size_t scheduler_name_len, int64_t scheduler_position,
    const void* rng_state, size_t rng_state_len, const void* rollout, size_t rollout_len,
    loradb_checkpoint_info_t* out, char** errmsg);

/* A checkpoint's metadata. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out NULL, wrong
 * struct_size); LORADB_NOT_FOUND; LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_checkpoint_get(loradb_store_t* store, uint64_t id,
                                                    loradb_checkpoint_info_t* out, char** errmsg);

/* ---- verification ------------------------------------------------------------------------- */

/* Checks the whole store (catalog cross-references, every blob's size and checksum). *ok = 1
 * when consistent; *report_json (may be NULL; free with loradb_free) receives
 * {"ok", "problems": [...], "reclaimable": [...], "blobs_checked", "bytes_checked"}.
 * Returns: LORADB_OK (also when problems were found: see *ok); LORADB_INVALID_ARGUMENT (ok
 * NULL); LORADB_IO_ERROR (the walk could not finish); LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_verify(loradb_store_t* store, int* ok, char** report_json,
                                            size_t* report_json_len, char** errmsg);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LORADB_API_C_LORADB_H_ */
