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
 *    mismatches and wrong pointers). Structs that grew keep accepting their earlier sizes (named
 *    LORADB_<STRUCT>_V<n>_SIZE below): the library fills only the fields that fit.
 *
 * Thread safety
 *  - loradb_store_t is thread-safe: any number of threads may call functions on one store at
 *    once, except loradb_close, which must not race with any other call on that store.
 *  - loradb_tensors_t is immutable after creation: concurrent reads are safe; destroy it from one
 *    thread once no other thread uses it. Tensor views stay valid until it is destroyed.
 *  - loradb_options_t is not thread-safe (build it on one thread, then pass it to loradb_open).
 *  - loradb_lease_t and loradb_batch_lease_t: their accessors only read, so any number of
 *    threads may use one lease at once; release it from one thread once no other thread uses
 *    it. A lease may be released on a different thread from the one that acquired it.
 *
 * Residency (the CPU cache and device tiers)
 *  - A store opens with a CPU cache (defaults: 8 GiB budget, W-TinyLFU eviction, io_uring loader
 *    falling back to a pread pool) and no device tier; loradb_options_set_cpu_cache with a zero
 *    budget opens it without tiers (the acquire/prefetch/evict calls then return
 *    LORADB_UNAVAILABLE), loradb_options_set_device adds the device tier.
 *  - A lease pins its adapters: eviction never touches them, their tensor views stay valid until
 *    the lease is released. Leases must be released before loradb_close: while any lease of a
 *    store is alive, loradb_close returns LORADB_CONFLICT and leaves the store open and usable.
 *  - When the bound on concurrent cold loads is reached, acquire and prefetch return
 *    LORADB_RESOURCE_EXHAUSTED at once (never an unbounded queue) with a suggested wait in
 *    *retry_after_ms; nothing is pinned then.
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
  LORADB_IO_ERROR = 7,           /* reading or writing files failed (EIO, permissions, ...) */
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

/* Which loader reads blobs into the CPU cache. */
typedef enum loradb_loader_t {
  LORADB_LOADER_AUTO = 0,     /* io_uring when it initialises, else the pread pool */
  LORADB_LOADER_IO_URING = 1, /* io_uring or loradb_open fails (LORADB_UNAVAILABLE) */
  LORADB_LOADER_PREAD = 2     /* a pread thread pool */
} loradb_loader_t;

/* Which backend holds the device tier's arena. */
typedef enum loradb_device_t {
  LORADB_DEVICE_NONE = 0, /* no device tier (the default) */
  LORADB_DEVICE_HOST = 1, /* host memory: works without a GPU, pointers are host pointers */
  LORADB_DEVICE_CUDA = 2, /* CUDA device memory; loradb_open fails without a device */
  LORADB_DEVICE_AUTO = 3  /* CUDA when a device is present, else host */
} loradb_device_t;

typedef struct loradb_store_t loradb_store_t;
typedef struct loradb_options_t loradb_options_t;
typedef struct loradb_tensors_t loradb_tensors_t;
typedef struct loradb_lease_t loradb_lease_t;             /* one revision in the CPU cache */
typedef struct loradb_batch_lease_t loradb_batch_lease_t; /* N revisions in the device tier */

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
  int has_slot;      /* 1 when tier is LORADB_TIER_GPU: `slot` is its device slot */
  uint32_t slot;     /* the device slot (meaningful when has_slot is 1) */
  int cpu_leases;    /* leases on the CPU cache entry now */
  int device_leases; /* batch leases covering the device copy now */
  /* Version 2 (struct_size = sizeof(loradb_located_t); LORADB_LOCATED_V1_SIZE stops above): */
  uint64_t device_bytes; /* bytes in the device slot (the rank's shard under TP); 0 unless GPU */
  uint32_t tp_rank;      /* the device tier's TP placement: rank `tp_rank` of `tp_degree` */
  uint32_t tp_degree;    /* 1: no TP placement (also without a device tier) */
} loradb_located_t;

/* sizeof(loradb_located_t) before device_bytes/tp_rank/tp_degree were added (still accepted). */
#define LORADB_LOCATED_V1_SIZE offsetof(loradb_located_t, device_bytes)

/* An adapter of a device batch lease. Set struct_size = sizeof(loradb_batch_adapter_t). */
typedef struct loradb_batch_adapter_t {
  size_t struct_size;
  uint64_t revision;
  uint32_t slot;       /* the device slot it occupies while leased */
  size_t tensor_count; /* views: loradb_batch_tensor_at(batch, index, 0..tensor_count-1) */
  uint64_t bytes;      /* payload bytes in the arena */
  uint64_t pages;      /* arena pages held */
  int device_pointers; /* 1: tensor `data` are device (CUDA) pointers; 0: host pointers */
} loradb_batch_adapter_t;

/* Residency statistics, counters since open. Set struct_size = sizeof(loradb_stats_t). */
typedef struct loradb_stats_t {
  size_t struct_size;
  int tiers; /* 0: opened without tiers (everything below is 0) */
  /* CPU cache */
  uint64_t cpu_budget_bytes;
  uint64_t cpu_hits;   /* acquires that found the revision resident */
  uint64_t cpu_misses; /* acquires that did not (loaded, joined or rejected) */
  uint64_t cpu_loads;  /* loads that succeeded */
  uint64_t cpu_load_failures;
  uint64_t cpu_joined;        /* requests that joined a load already pending (single flight) */
  uint64_t cpu_rejections;    /* LORADB_RESOURCE_EXHAUSTED answers (load bound reached) */
  uint64_t cpu_negative_hits; /* answered from the remembered failure of a recent load */
  uint64_t cpu_prefetches;
  uint64_t cpu_evictions;
  uint64_t cpu_bytes_in;  /* bytes inserted by loads */
  uint64_t cpu_bytes_out; /* bytes dropped by evictions */
  uint64_t cpu_resident_bytes;
  uint64_t cpu_resident_entries;
  uint64_t cpu_leased_bytes;
  uint64_t cpu_inflight_loads;
  uint64_t cpu_queued_loads;
  uint64_t cpu_load_p50_us; /* load latency quantiles (bucket upper bounds) */
  uint64_t cpu_load_p99_us;
  char eviction[16]; /* "lru", "s3fifo", "wtinylfu" (NUL-terminated) */
  /* loader */
  loradb_loader_t loader;    /* the loader actually running (never LORADB_LOADER_AUTO) */
  int loader_io_uring_errno; /* why io_uring is not used (0: it is, or was not tried) */
  uint64_t loader_files;
  uint64_t loader_bytes;
  uint64_t loader_checksum_failures;
  uint64_t loader_read_errors;
  /* device tier (all 0 when there is none) */
  loradb_device_t device; /* LORADB_DEVICE_NONE, _HOST or _CUDA */
  uint64_t device_batches;
  uint64_t device_batch_failures;
  uint64_t device_hits;
  uint64_t device_misses;
  uint64_t device_evictions;
  uint64_t device_bytes_copied;
  uint64_t device_resident_adapters;
  uint64_t device_leased_adapters;
  uint64_t device_arena_bytes;
  uint64_t device_page_bytes;
  uint64_t device_pages_total;
  uint64_t device_pages_free;
  uint64_t device_largest_free_run; /* pages */
  uint64_t device_payload_bytes;
  uint64_t device_page_waste_bytes; /* internal fragmentation: page rounding */
  double device_fragmentation;      /* external: 1 - largest_free_run / pages_free */
  /* Version 2 (struct_size = sizeof(loradb_stats_t); LORADB_STATS_V1_SIZE stops above): */
  uint64_t cpu_pooled_bytes;   /* free host buffers kept for reuse; they count against
                                  cpu_budget_bytes with cpu_resident_bytes */
  uint64_t cpu_pool_cap_bytes; /* the most the pool may hold now (the budget's unused room) */
  uint32_t tp_rank;            /* the device tier's TP placement (loradb_options_set_tp) */
  uint32_t tp_degree;          /* 1: none */
  int tp_derived;              /* 1: the CPU tier holds each revision's derived per-rank blob */
} loradb_stats_t;

/* sizeof(loradb_stats_t) before the version 2 fields were added (still accepted). */
#define LORADB_STATS_V1_SIZE offsetof(loradb_stats_t, cpu_pooled_bytes)

/* Tensor-parallel placement of the tiers (loradb_options_set_tp): this process is rank `rank` of
 * `degree` TP ranks; device slots hold only the rank's shard of each adapter (B of q/k/v/gate/up
 * by output rows, A of o/down by input columns, MoE experts likewise, the rest whole).
 * Set struct_size = sizeof(loradb_tp_options_t). */
typedef struct loradb_tp_options_t {
  size_t struct_size;
  uint32_t rank;   /* < degree */
  uint32_t degree; /* 1..4096; 1: no TP placement (the default) */
  /* The CUDA device of the arena (LORADB_DEVICE_CUDA / _AUTO), e.g. the rank's GPU; -1 keeps
   * the default (0). */
  int32_t cuda_device;
  /* Non-empty (degree > 1 only): the CPU tier holds each revision's pre-sliced per-rank blob,
   * built under this directory on first use and verified on every read; a derived blob is
   * removed when the last revision referencing its source is deleted (and swept at open).
   * NULL/0: the CPU tier holds whole revisions. */
  const char* derived_dir;
  size_t derived_dir_len;
} loradb_tp_options_t;

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

/* The CPU cache: byte budget (0: open the store without residency tiers) and eviction policy
 * by name ("lru", "s3fifo", "wtinylfu"; NULL/empty keeps the default, W-TinyLFU).
 * `expected_entries` sizes W-TinyLFU's frequency sketch (0: keep the default, 1024).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (options NULL, unknown policy name);
 * LORADB_INVALID_HANDLE. Not thread-safe (see loradb_options_t). */
LORADB_EXPORT loradb_status_t loradb_options_set_cpu_cache(loradb_options_t* options,
                                                           uint64_t budget_bytes,
                                                           const char* eviction,
                                                           size_t eviction_len,
                                                           uint64_t expected_entries);

/* The loader and the bound on cold loads: `max_inflight_loads` run at once (>= 1), at most
 * `max_queued_loads` more wait (0 allowed: no queue); past that, acquire and prefetch return
 * LORADB_RESOURCE_EXHAUSTED with a retry-after hint. `negative_ttl_ms`: how long a failed load
 * is remembered (repeated requests fail fast; 0: not remembered).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (options NULL, unknown loader value,
 * max_inflight_loads 0, a value above 65536); LORADB_INVALID_HANDLE. Not thread-safe. */
LORADB_EXPORT loradb_status_t loradb_options_set_loader(loradb_options_t* options,
                                                        loradb_loader_t loader,
                                                        uint32_t max_inflight_loads,
                                                        uint32_t max_queued_loads,
                                                        uint32_t negative_ttl_ms);

/* The device tier: backend, arena size in bytes and page size (0: 64 KiB; else a power of two
 * >= 256 and <= arena_bytes). LORADB_DEVICE_NONE removes the device tier.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (options NULL, unknown device value, arena 0 with
 * a device, bad page size); LORADB_INVALID_HANDLE. Not thread-safe. Whether the arena can be
 * allocated (and CUDA is present) is checked by loradb_open. */
LORADB_EXPORT loradb_status_t loradb_options_set_device(loradb_options_t* options,
                                                        loradb_device_t device,
                                                        uint64_t arena_bytes, uint64_t page_bytes);

/* The tiers' tensor-parallel placement (see loradb_tp_options_t); `tp` NULL resets it (no TP).
 * Whether the placement fits each adapter (dimensions divisible by the degree) is checked when
 * the adapter is loaded. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (options NULL, wrong
 * struct_size, degree 0 or above 4096, rank >= degree, cuda_device < -1, derived_dir NULL with a
 * non-zero length, containing a NUL byte, or set with degree 1; *errmsg names the field; nothing
 * changes); LORADB_INVALID_HANDLE. Not thread-safe (see loradb_options_t). */
LORADB_EXPORT loradb_status_t loradb_options_set_tp(loradb_options_t* options,
                                                    const loradb_tp_options_t* tp, char** errmsg);

/* ---- store -------------------------------------------------------------------------------- */

/* Opens (or creates) the store in directory `dir`. `options` may be NULL (defaults).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out or dir NULL, empty dir; `dir` exists but is
 * not a directory: "... is not a store directory", nothing is created);
 * LORADB_INVALID_HANDLE (destroyed options); LORADB_NOT_FOUND (missing and not created);
 * LORADB_CONFLICT (written by a newer schema version, or opened across fork());
 * LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_open(const char* dir, size_t dir_len,
                                          const loradb_options_t* options, loradb_store_t** out,
                                          char** errmsg);

/* Closes the store and sets *store to NULL. Must not race with other calls on the store or its
 * leases; a loradb_tensors_t read from it stays valid after close. Leases must be released
 * first: while any loradb_lease_t / loradb_batch_lease_t of the store is alive, close returns
 * LORADB_CONFLICT and changes nothing (the store stays open, *store is kept).
 * Returns: LORADB_OK (also when *store is NULL); LORADB_INVALID_ARGUMENT (store is NULL);
 * LORADB_INVALID_HANDLE (already closed); LORADB_CONFLICT (leases still alive). */
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

/* Every base as a JSON array of Base objects (docs/json.md; without the module table) in *json
 * (free with loradb_free), its length in *json_len (may be NULL).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (json NULL); LORADB_INVALID_HANDLE;
 * LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_base_list(loradb_store_t* store, char** json, size_t* json_len,
                                               char** errmsg);

/* ---- policies ----------------------------------------------------------------------------- */

/* Creates a policy bound to a base. `labels_json` (may be empty) is a JSON object of strings.
 * *policy_id (may be NULL) receives the new id. Policy names: 1-128 characters of letters,
 * digits and `_ . - /`, every '/'-separated segment non-empty and starting with a letter or
 * digit (so `a/../b`, `a//b`, `x/`, `/x`, `.` are refused). Every call taking a policy or base
 * name applies the same check and returns LORADB_INVALID_ARGUMENT naming the rule broken.
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

/* Policies in id order with id > after_id, at most `limit` (1..1000), as a JSON array of Policy
 * objects (docs/json.md). *next_cursor (may be NULL) receives the id to
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

/* A revision by reference: "123" (id), "POLICY:ALIAS" or "POLICY@SEQ". Ids and seqs are
 * canonical decimal (digits only, no sign, spaces or leading zero: " 2" and "01" are malformed);
 * the policy and alias follow the name rules (":serving" has an empty policy name).
 * Returns: as loradb_revision_get, plus LORADB_INVALID_ARGUMENT for a malformed reference, with a
 * message naming what is wrong. */
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

/* Writes a revision as a PEFT directory (adapter_config.json + adapter_model.safetensors), in
 * the adapter's own layout (LORADB_PEFT_LAYOUT_AS_IMPORTED below).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_NOT_FOUND; LORADB_IO_ERROR;
 * LORADB_CORRUPT; LORADB_CONFLICT (a layout that cannot hold this revision, see
 * loradb_revision_export_peft_layout); LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_revision_export_peft(loradb_store_t* store, uint64_t id,
                                                          const char* out_dir, size_t out_dir_len,
                                                          char** errmsg);

/* The layouts of a PEFT export (`loradb export --layout`). */
typedef enum {
  /* The adapter's own layout, as imported or trained; LoRA on fused MoE expert parameters is
   * written in PEFT's target_parameters layout. Per-expert LoRA on a qwen3_moe base's experts
   * published without a PEFT config (trained by loradb, or given as tensors) is refused
   * (LORADB_CONFLICT): peft on transformers >= 5 holds those experts as fused parameters and
   * would skip the tensors without an error. */
  LORADB_PEFT_LAYOUT_AS_IMPORTED = 0,
  /* MoE expert LoRA as per-expert target_modules (experts.{e}.gate_proj, ...), the layout peft
   * uses where experts are modules (transformers < 5). */
  LORADB_PEFT_LAYOUT_PER_EXPERT = 1
} loradb_peft_layout_t;

/* loradb_revision_export_peft in the given layout.
 * Returns: as loradb_revision_export_peft; LORADB_INVALID_ARGUMENT for an unknown layout.
 * Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_revision_export_peft_layout(loradb_store_t* store, uint64_t id,
                                                                 const char* out_dir,
                                                                 size_t out_dir_len,
                                                                 loradb_peft_layout_t layout,
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

/* The alias's move log in commit order, as a JSON array of AliasLogEntry objects (docs/json.md):
 * "seq" numbers the moves 1, 2, ... in the order they committed; "time_us" is the wall clock at
 * the move (informational: a stepped clock can make it go backwards).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_NOT_FOUND (policy);
 * LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_alias_history(loradb_store_t* store, const char* policy,
                                                   size_t policy_len, const char* alias,
                                                   size_t alias_len, char** json, size_t* json_len,
                                                   char** errmsg);

/* Which base, checkpoint, revision and tier answer (policy, alias). The tier is the live one
 * (LORADB_TIER_GPU with its slot when the revision is in the device tier, else LORADB_TIER_CPU
 * when in the CPU cache, else LORADB_TIER_STORAGE), with the leases on it now, the slot's bytes
 * and the TP placement. Free out->base_name and out->blob_path with loradb_free. Returns:
 * LORADB_OK; LORADB_INVALID_ARGUMENT (out NULL, struct_size neither sizeof nor
 * LORADB_LOCATED_V1_SIZE, bad names); LORADB_NOT_FOUND;
 * LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_locate(loradb_store_t* store, const char* policy,
                                            size_t policy_len, const char* alias, size_t alias_len,
                                            loradb_located_t* out, char** errmsg);

/* ---- residency: CPU cache leases ----------------------------------------------------------- */

/* A lease on revision `revision` in the CPU cache, loading it from storage when needed
 * (concurrent misses of one revision share one load). Blocks until the load ends or
 * `timeout_ms` passes (0: no limit; LORADB_UNAVAILABLE on timeout, the load continues).
 * `retry_after_ms` (may be NULL) receives the suggested wait on LORADB_RESOURCE_EXHAUSTED, else
 * 0. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out NULL); LORADB_NOT_FOUND (no such live
 * revision, or its blob is missing); LORADB_CORRUPT (checksum mismatch); LORADB_RESOURCE_EXHAUSTED
 * (load bound reached; *out stays NULL); LORADB_UNAVAILABLE (no tiers, or timeout);
 * LORADB_IO_ERROR; LORADB_INVALID_HANDLE. A failed load is remembered briefly (see
 * loradb_options_set_loader): repeated requests get the same code at once. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_acquire(loradb_store_t* store, uint64_t revision,
                                             uint32_t timeout_ms, loradb_lease_t** out,
                                             uint32_t* retry_after_ms, char** errmsg);

/* The leased revision's id in *revision. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (NULL);
 * LORADB_INVALID_HANDLE (released). Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_lease_revision(const loradb_lease_t* lease,
                                                    uint64_t* revision);

/* Number of tensors (every original tensor name, MoE expert members included); 0 for NULL or
 * released leases. Thread-safe. */
LORADB_EXPORT size_t loradb_lease_tensor_count(const loradb_lease_t* lease);

/* The tensor at `index` (name, dtype, shape, host pointer, byte length), valid until the lease
 * is released. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (NULL, wrong struct_size);
 * LORADB_OUT_OF_RANGE; LORADB_INVALID_HANDLE (released). Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_lease_tensor_at(const loradb_lease_t* lease, size_t index,
                                                     loradb_tensor_view_t* view);

/* The tensor called `name`. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_NOT_FOUND;
 * LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_lease_tensor_find(const loradb_lease_t* lease,
                                                       const char* name, size_t name_len,
                                                       loradb_tensor_view_t* view);

/* Releases the lease (its views become invalid; the entry may now be evicted) and sets *lease
 * to NULL. Returns: LORADB_OK (also when *lease is NULL); LORADB_INVALID_ARGUMENT (lease is
 * NULL); LORADB_INVALID_HANDLE (already released: a stale copy). Thread-safe against other
 * leases; not against other calls on the same lease. */
LORADB_EXPORT loradb_status_t loradb_release(loradb_lease_t** lease);

/* ---- residency: device batch leases -------------------------------------------------------- */

/* One lease over the distinct revisions among `revisions[0..count)` (duplicates allowed) in the
 * device tier: misses are loaded through the CPU cache and copied into the arena, unleased
 * adapters are evicted least recently used first. All or nothing: on any error nothing stays
 * pinned. `retry_after_ms` (may be NULL) as for loradb_acquire.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (revisions NULL, count 0 or > 65536, out NULL);
 * LORADB_NOT_FOUND (a revision, named in the message); LORADB_CORRUPT;
 * LORADB_RESOURCE_EXHAUSTED (the batch does not fit beside pinned adapters, or the load bound
 * is reached); LORADB_UNAVAILABLE (no device tier); LORADB_IO_ERROR; LORADB_INVALID_HANDLE.
 * Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_acquire_batch(loradb_store_t* store, const uint64_t* revisions,
                                                   size_t count, loradb_batch_lease_t** out,
                                                   uint32_t* retry_after_ms, char** errmsg);

/* Number of distinct revisions in the batch (first-requested order); 0 for NULL or released.
 * Thread-safe. */
LORADB_EXPORT size_t loradb_batch_size(const loradb_batch_lease_t* batch);

/* The adapter at `index` (0..size-1). Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (out NULL,
 * wrong struct_size); LORADB_OUT_OF_RANGE; LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_batch_adapter(const loradb_batch_lease_t* batch, size_t index,
                                                   loradb_batch_adapter_t* out);

/* The index of `revision` in the batch. Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (index
 * NULL); LORADB_NOT_FOUND (not in this batch); LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_batch_find(const loradb_batch_lease_t* batch,
                                                uint64_t revision, size_t* index);

/* Tensor `tensor_index` of adapter `adapter_index`; `data` is a device pointer when the
 * adapter's device_pointers is 1. Valid until the batch is released.
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT; LORADB_OUT_OF_RANGE (either index);
 * LORADB_INVALID_HANDLE. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_batch_tensor_at(const loradb_batch_lease_t* batch,
                                                     size_t adapter_index, size_t tensor_index,
                                                     loradb_tensor_view_t* view);

/* The tensor called `name` of adapter `adapter_index`. Returns: LORADB_OK;
 * LORADB_INVALID_ARGUMENT; LORADB_OUT_OF_RANGE; LORADB_NOT_FOUND; LORADB_INVALID_HANDLE. */
LORADB_EXPORT loradb_status_t loradb_batch_tensor_find(const loradb_batch_lease_t* batch,
                                                       size_t adapter_index, const char* name,
                                                       size_t name_len, loradb_tensor_view_t* view);

/* Releases every pin of the batch and sets *batch to NULL. Returns: LORADB_OK (also when
 * *batch is NULL); LORADB_INVALID_ARGUMENT (batch is NULL); LORADB_INVALID_HANDLE (already
 * released). Same thread rules as loradb_release. */
LORADB_EXPORT loradb_status_t loradb_batch_release(loradb_batch_lease_t** batch);

/* ---- residency: prefetch, evict, stats ----------------------------------------------------- */

/* Starts loading `revision` into the CPU cache in the background (lower priority than
 * acquires) unless it is resident or already loading. `retry_after_ms` as for loradb_acquire.
 * Returns: LORADB_OK (resident, loading, or started); LORADB_NOT_FOUND (no such live revision;
 * also a remembered failed load); LORADB_CORRUPT (remembered failed load);
 * LORADB_RESOURCE_EXHAUSTED (load bound reached); LORADB_UNAVAILABLE (no tiers);
 * LORADB_INVALID_HANDLE; LORADB_IO_ERROR. Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_prefetch(loradb_store_t* store, uint64_t revision,
                                              uint32_t* retry_after_ms, char** errmsg);

/* Drops `revision` from tier `tier` now (LORADB_TIER_CPU or LORADB_TIER_GPU).
 * Returns: LORADB_OK; LORADB_INVALID_ARGUMENT (LORADB_TIER_STORAGE or an unknown tier);
 * LORADB_NOT_FOUND (not resident in that tier); LORADB_CONFLICT (leased, or still loading or
 * copying); LORADB_UNAVAILABLE (no tiers / no device tier); LORADB_INVALID_HANDLE.
 * Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_evict(loradb_store_t* store, uint64_t revision,
                                           loradb_tier_t tier, char** errmsg);

/* Counters and gauges of the CPU cache, the loader and the device tier (a consistent snapshot
 * per tier). Returns: LORADB_OK (also without tiers: out->tiers is 0); LORADB_INVALID_ARGUMENT
 * (out NULL, struct_size neither sizeof nor LORADB_STATS_V1_SIZE); LORADB_INVALID_HANDLE.
 * Thread-safe. */
LORADB_EXPORT loradb_status_t loradb_stats(loradb_store_t* store, loradb_stats_t* out,
                                           char** errmsg);

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

/* Checks the whole store, as `loradb verify` does: catalog cross-references, every blob's size
 * and checksum, alias logs (numbered 1, 2, ... in commit order, each move starting where the
 * previous one ended, the last one at the alias), the revisions-by-blob index. *ok = 1
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
