/* rt.h - the public surface of libmbtrt, the runtime library linked into every executable that
 * mbtc builds (and into tools/gendata.c and the tests under tests/unit/test_rt_*.c).
 *
 * Pipeline position: after the compiler. The generated host code (compiler/host) calls
 * into libmbtrt for everything that is not a kernel. This header holds the first, self-contained
 * modules, one section each, in the order a training run needs them:
 *
 *   errors       rt_error.c     status codes and the caller's message buffer
 *   files        rt_file.c      read-only mappings, atomic (temporary + rename) writes
 *   random       rng.c          Philox4x32-10, uniforms, normals, parameter initialisation
 *   token data   data.c         llm.c / nanoGPT token shards, batches, shuffling, resume position
 *   safetensors  safetensors.c  reading (pread) and atomic writing of safetensors files
 *   json         json.c         JSON reading and writing (jansson): headers, state.json, logs
 *
 * The ABI with generated code (the RtProgram descriptor, the thread pool, batched SGEMM) is
 * rt_program.h; the executable built on both (command line, train loop, logs, weights,
 * generation) is rt_exec.h.
 *
 * Conventions shared by every module (docs/runtime.md is the user's description):
 * - A function that can fail returns RtStatus (RT_OK is 0) and on failure fills the caller's
 *   RtError with a message saying what was being done and why, ending with the C library's
 *   reason where there is one: `cannot open data shard 'x.bin': No such file or directory`.
 * - The library never exits, never prints and keeps no global mutable state: everything lives in
 *   objects the caller owns, so different objects may be used from different threads. (Only the
 *   executable's side, rt_exec.h, prints and picks exit statuses; and the thread pool stops the
 *   process with an internal error if a mutex operation fails, which only corrupt memory causes.)
 * - Functions are prefixed rt_, types Rt, constants RT_. */
#ifndef MBT_RT_H
#define MBT_RT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define RT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define RT_PRINTF(f, a)
#endif

/* ==== errors (rt_error.c) ===================================================================== */

typedef enum RtStatus {
    RT_OK = 0,
    RT_ERR_IO,       /* a C library call failed; the message ends with its reason */
    RT_ERR_FORMAT,   /* a file's contents are malformed (a bad shard, a bad safetensors header) */
    RT_ERR_ARG,      /* the caller passed an invalid argument */
    RT_ERR_NOMEM,    /* out of memory */
    RT_ERR_NOTFOUND, /* a named thing does not exist (no file matches, no such tensor) */
} RtStatus;

#define RT_ERROR_MAX 1024 /* longer messages are cut, ending in "..." */

/* The caller's message buffer: filled by a failing function, untouched by a succeeding one. */
typedef struct RtError {
    RtStatus code;          /* what kind of failure (RT_OK after rt_error_clear) */
    char msg[RT_ERROR_MAX]; /* one line, no trailing newline */
} RtError;

void rt_error_clear(RtError *e);                                                   /* code RT_OK, empty message */
RtStatus rt_fail(RtError *e, RtStatus code, const char *fmt, ...) RT_PRINTF(3, 4); /* fills e (may be NULL); returns code */
RtStatus rt_fail_errno(RtError *e, int errnum, const char *fmt, ...)
    RT_PRINTF(3, 4); /* "<fmt>: <strerror(errnum)>"; RT_ERR_NOMEM for ENOMEM, else RT_ERR_IO */
RtStatus rt_error_context(RtError *e, const char *fmt, ...)
    RT_PRINTF(2, 3);                    /* prefixes "<fmt>: " to e's message; returns e->code */
const char *rt_status_name(RtStatus s); /* "ok", "i/o error", "bad format", ... */

/* ==== files (rt_file.c) ======================================================================= */

/* Opens a regular file to read: a FIFO, a device or a directory is refused with a message before
 * anything reads it (opened with O_NONBLOCK, so that a FIFO with no writer cannot block the open;
 * the flag is cleared again). *fd and *size (its size now) on success; `what` names it in messages. */
RtStatus rt_open_regular(const char *path, const char *what, int *fd, int64_t *size, RtError *err);
/* What a file that is not regular is, for messages: "a directory", "a FIFO (named pipe)", "a
 * socket", "a character device", "a block device", else "not a regular file" (st_mode). */
const char *rt_file_kind(unsigned mode);

/* Reads up to n bytes at offset off into buf, retrying after EINTR and partial reads: the count
 * read (less than n only where the file ends), or -1 with errno set. */
int64_t rt_pread_all(int fd, void *buf, int64_t n, int64_t off);

/* A whole regular file read into memory with pread (nothing in the runtime maps a file: a file
 * that shrinks while it is read is then an error with a message, never a SIGBUS). Refused: a
 * file that is not regular (rt_open_regular), one over max_bytes, one that shrank between its
 * fstat and the last read. *data is malloc'd (NUL-terminated, for text), *size its length. */
RtStatus rt_read_file(const char *path, const char *what, int64_t max_bytes, unsigned char **data, size_t *size, RtError *err);

/* A file written atomically: bytes go to a temporary file beside `path`; commit fsyncs it,
 * renames it over `path` and fsyncs the directory; abort removes it. Until commit succeeds,
 * whatever was at `path` is untouched. */
typedef struct RtAtomicFile {
    int fd;           /* of the temporary file; -1 when not open */
    char *path;       /* the final name */
    char *tmp;        /* the temporary name: "<path>.tmp.<pid>.<n>" */
    const char *what; /* names the file in messages ("safetensors file"); not owned */
} RtAtomicFile;

RtStatus rt_atomic_begin(RtAtomicFile *f, const char *path, const char *what,
                         RtError *err); /* creates the temporary file (mode 0644 before umask) */
RtStatus rt_atomic_write(RtAtomicFile *f, const void *buf, size_t n,
                         RtError *err); /* appends n bytes (on failure the caller aborts) */
RtStatus rt_atomic_commit(
    RtAtomicFile *f,
    RtError *
        err); /* fsync, close, rename into place, fsync the directory; aborts on failure (a failure after the rename leaves the new file in place) */
void rt_atomic_abort(RtAtomicFile *f); /* closes and removes the temporary file; safe after commit */
RtStatus rt_atomic_write_file(const char *path, const char *what, const void *buf, size_t n,
                              RtError *err); /* begin, write, commit: a whole small file */
RtStatus rt_write_all(int fd, const void *buf, size_t n, const char *what, const char *path,
                      RtError *err);                  /* write(2) until done, retrying EINTR */
RtStatus rt_fsync_dir(const char *dir, RtError *err); /* fsync(2) of a directory, so a rename or unlink in it is durable */

/* Checksums (of checkpoint files, and of the compiled program: RtProgram.hash) are XXH3-128, from
 * Debian's libxxhash (header-only here, so executables need no library): 32 lowercase hex digits,
 * high half first as XXH3's canonical form writes it. */
#define RT_CHECKSUM_CHARS 33 /* 32 digits and the NUL */
void rt_checksum(const void *data, size_t n, char out[RT_CHECKSUM_CHARS]);
RtStatus rt_checksum_file(const char *path, const char *what, char out[RT_CHECKSUM_CHARS], int64_t *bytes, RtError *err);
/* A file's identity without reading it all: the checksum of its size, its first and its last MiB
 * (of the whole file when it is 2 MiB or less). Tells a data shard from another one of its size. */
RtStatus rt_checksum_sample(const char *path, const char *what, char out[RT_CHECKSUM_CHARS], int64_t *bytes, RtError *err);

/* ==== random numbers (rng.c) ================================================================== */

/* Philox4x32 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11): a keyed
 * bijection of a 128-bit counter; the output depends only on (counter, key). */
void rt_philox4x32_r(const uint32_t ctr[4], const uint32_t key[2], int rounds,
                     uint32_t out[4]); /* `rounds` rounds (the known-answer tests use 7 and 10) */
void rt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]); /* Philox4x32-10, used everywhere */
float rt_u01_f32(uint32_t bits);             /* uniform in [0, 1): the top 24 bits times 2^-24 (exact in a float) */
double rt_u01_f64(uint32_t hi, uint32_t lo); /* uniform in [0, 1): 53 bits from two draws */
void rt_box_muller(uint32_t a, uint32_t b, double *z0, double *z1); /* two independent standard normals from two 32-bit draws */
uint64_t rt_hash_name(const char *name); /* FNV-1a 64 of the name's bytes (offset 0xcbf29ce484222325, prime 0x100000001b3) */

/* Domains keep the streams of different uses apart: the Philox key is seed ^ (domain << 32). */
#define RT_RNG_DOMAIN_INIT UINT64_C(0x696e6974)    /* "init": parameter initialisation */
#define RT_RNG_DOMAIN_DATA UINT64_C(0x64617461)    /* "data": shuffling token windows */
#define RT_RNG_DOMAIN_GENDATA UINT64_C(0x67656e64) /* "gend": tools/gendata.c */
#define RT_RNG_DOMAIN_SAMPLE UINT64_C(0x73616d70)  /* "samp": sampling generated tokens (generate.c) */

/* A sequential stream: block b of stream s is Philox4x32-10 of counter (b lo, b hi, s lo, s hi).
 * The struct is plain data: copying it saves the stream's position exactly. */
typedef struct RtRng {
    uint32_t key[2]; /* seed ^ (domain << 32) */
    uint64_t stream; /* counter words 2 and 3 */
    uint64_t block;  /* the next block to generate (counter words 0 and 1) */
    uint32_t out[4]; /* the current block's output */
    int used;        /* words of out[] already returned (4: none left) */
} RtRng;

void rt_rng_init(RtRng *r, uint64_t seed, uint64_t domain, uint64_t stream); /* starts at block 0 */
uint32_t rt_rng_u32(RtRng *r);                                               /* the next 32-bit word */
uint64_t rt_rng_u64(RtRng *r);                                               /* two words, first one high */
double rt_rng_f64(RtRng *r);                                                 /* uniform in [0, 1), 53 bits */
uint64_t rt_rng_below(RtRng *r, uint64_t n); /* uniform in [0, n) without bias (rejection); n > 0 */

/* Parameter initialisation. Element i of the parameter `name` takes its value from block i / 4,
 * word i % 4, of stream rt_hash_name(name) in domain RT_RNG_DOMAIN_INIT under `seed` (normals:
 * Box-Muller on words (0,1) and (2,3)), so the value depends only on (seed, name, i): never on
 * the thread count, the chunking or the order in which parameters are created. */
typedef enum RtInitKind {
    RT_INIT_ZEROS,    /* 0 */
    RT_INIT_ONES,     /* 1 */
    RT_INIT_CONSTANT, /* a */
    RT_INIT_NORMAL,   /* normal(mean a, std b), b >= 0 */
    RT_INIT_UNIFORM,  /* uniform in [a, b), a <= b */
} RtInitKind;

RtStatus rt_init_param(float *dst, int64_t n, uint64_t seed, const char *name, RtInitKind kind, double a, double b,
                       RtError *err); /* fills dst[0..n) */
RtStatus rt_init_param_range(float *dst, int64_t begin, int64_t end, uint64_t seed, uint64_t name_hash, RtInitKind kind, double a,
                             double b, RtError *err); /* fills elements [begin, end) into dst[0..end-begin) */

/* A keyed permutation of [0, n): a balanced Feistel network over Philox with cycle walking.
 * rt_perm_apply(p, i) for i in [0, n) visits every value once; it needs no memory. */
typedef struct RtPerm {
    uint64_t n;        /* the domain size */
    int half_bits;     /* bits of each Feistel half (the network covers 2^(2*half_bits) >= n) */
    uint32_t key[2];   /* Philox key */
    uint32_t tweak[2]; /* counter words 2 and 3 (which permutation) */
} RtPerm;

void rt_perm_init(RtPerm *p, uint64_t n, uint64_t seed, uint64_t domain, uint32_t tweak0,
                  uint32_t tweak1);                  /* the permutation keyed by all of these */
uint64_t rt_perm_apply(const RtPerm *p, uint64_t i); /* the i-th element (i < n) */

/* ==== token data (data.c) ===================================================================== */

#define RT_LLMC_MAGIC 20240520     /* llm.c shard, uint16 tokens (GPT-2) */
#define RT_LLMC_MAGIC_U32 20240801 /* llm.c shard, uint32 tokens (Llama 3) */
#define RT_LLMC_VERSION 1
#define RT_LLMC_HEADER_BYTES 1024 /* 256 little-endian int32: magic, version, token count, zeros */

/* What a data source reads. Files are found with glob(3) and sorted byte-wise; each is
 * validated when the source opens; token ids are checked against vocab as windows are read. */
typedef struct RtDataSpec {
    const char *pattern;     /* glob of the training shards */
    const char *val_pattern; /* glob of held-out shards; NULL or "": hold out val_windows of pattern's data */
    int64_t seq;             /* T: a window is T+1 tokens, giving x (first T) and y (last T) */
    int64_t vocab;           /* token ids must be below this; 0: not checked */
    int shuffle;             /* training split: 1 = seeded shuffle each epoch, 0 = file order */
    uint64_t seed;           /* the shuffle's seed */
    int64_t val_windows;     /* without val_pattern: the last N windows of the data are held out */
} RtDataSpec;

typedef enum RtSplit {
    RT_SPLIT_TRAIN, /* pattern's windows (minus the held-out tail when there is no val_pattern) */
    RT_SPLIT_VAL,   /* val_pattern's windows, or the held-out tail; always in file order */
} RtSplit;

/* Where a source is: the next window is window `window` (in this epoch's order) of the
 * `shard`-th shard (in this epoch's order) of epoch `epoch`. The fingerprint ties it to the data
 * and settings it was taken from; seeking with another source's position is an error. */
typedef struct RtDataPos {
    uint64_t epoch;
    uint64_t shard;
    uint64_t window;
    uint64_t fingerprint;
} RtDataPos;

typedef struct RtData RtData;

RtStatus rt_data_open(RtData **out, const RtDataSpec *spec, RtSplit split, RtError *err); /* finds and validates the files */
void rt_data_close(RtData *d);                                                            /* unmaps and frees (NULL is fine) */
RtStatus rt_data_next(RtData *d, int64_t B, int32_t *x, int32_t *y,
                      RtError *err);     /* the next B windows: x, y are [B, T]; on error the position does not move */
RtDataPos rt_data_tell(const RtData *d); /* the position of the next window */
void rt_data_skip(RtData *d, int64_t n); /* passes n windows without reading them (other ranks read them) */
RtStatus rt_data_seek(RtData *d, const RtDataPos *pos,
                      RtError *err);                     /* restores a position from rt_data_tell of an identical source */
void rt_data_rewind(RtData *d);                          /* back to the first window of epoch 0 */
int64_t rt_data_windows(const RtData *d);                /* windows in one epoch of this split */
int64_t rt_data_seq(const RtData *d);                    /* T */
int64_t rt_data_nfiles(const RtData *d);                 /* files opened */
const char *rt_data_file(const RtData *d, int64_t i);    /* the i-th file's path (sorted order) */
int64_t rt_data_file_tokens(const RtData *d, int64_t i); /* tokens in the i-th file */
int64_t rt_data_left_out(const RtData *d,
                         const char **first); /* held-out files (by name: *_val*) the training glob matched and were left out */

/* Shard writing (tests, tools/gendata.c), atomically. */
typedef enum RtShardFormat {
    RT_SHARD_LLMC,     /* llm.c header (magic 20240520, version 1, count) + uint16 tokens */
    RT_SHARD_LLMC_U32, /* llm.c header (magic 20240801) + uint32 tokens */
    RT_SHARD_RAW,      /* bare uint16 tokens, as nanoGPT's prepare.py writes them */
} RtShardFormat;

RtStatus rt_shard_write(const char *path, RtShardFormat fmt, const uint32_t *tokens, int64_t n,
                        RtError *err); /* tokens must fit the format's width */

/* ==== safetensors (safetensors.c) ============================================================= */

#define RT_ST_MAX_RANK 16             /* dimensions a tensor may have */
#define RT_ST_MAX_HEADER 100000000ull /* header bytes accepted (the reference implementation's limit) */

/* The dtypes of the safetensors specification that are whole bytes, in the reference
 * implementation's order (increasing alignment); the writer lays tensors out in descending order
 * of this enum, then by name, as the reference does. */
typedef enum RtDtype {
    RT_BOOL,
    RT_U8,
    RT_I8,
    RT_F8_E5M2,
    RT_F8_E4M3,
    RT_F8_E8M0,
    RT_F8_E4M3FNUZ,
    RT_F8_E5M2FNUZ,
    RT_I16,
    RT_U16,
    RT_F16,
    RT_BF16,
    RT_I32,
    RT_U32,
    RT_F32,
    RT_C64,
    RT_F64,
    RT_I64,
    RT_U64,
    RT_DTYPE_COUNT
} RtDtype;

const char *rt_dtype_name(RtDtype t);            /* "F32", "BF16", ... */
int rt_dtype_size(RtDtype t);                    /* bytes per element */
int rt_dtype_parse(const char *s, RtDtype *out); /* 1 and *out for a known name, else 0 */

/* One tensor of an open file. */
typedef struct RtStTensor {
    const char *name; /* UTF-8, NUL-terminated (owned by the file) */
    RtDtype dtype;
    int rank; /* 0 for a scalar */
    int64_t shape[RT_ST_MAX_RANK];
    int64_t numel;             /* product of shape (1 for a scalar, 0 for an empty tensor) */
    uint64_t begin, end;       /* data_offsets: relative to the byte after the header */
    const unsigned char *data; /* begin's address when the file was opened from memory (not aligned in
                                * general); NULL when opened from a path: read with rt_st_read_* */
} RtStTensor;

typedef struct RtStFile RtStFile;

RtStatus rt_st_open(RtStFile **out, const char *path, RtError *err); /* reads and validates the header (pread) */
RtStatus rt_st_open_memory(RtStFile **out, const void *bytes, size_t n, const char *label,
                           RtError *err);                          /* the same over caller-owned bytes (kept alive until close) */
void rt_st_close(RtStFile *f);                                     /* NULL is fine */
int64_t rt_st_count(const RtStFile *f);                            /* tensors in the file */
const RtStTensor *rt_st_tensor(const RtStFile *f, int64_t i);      /* the i-th, in data-offset order */
const RtStTensor *rt_st_find(const RtStFile *f, const char *name); /* by name, or NULL */
int64_t rt_st_meta_count(const RtStFile *f);                       /* __metadata__ entries */
const char *rt_st_meta_key(const RtStFile *f, int64_t i);          /* i-th key (header order) */
const char *rt_st_meta_value(const RtStFile *f, int64_t i);        /* i-th value */
const char *rt_st_meta_get(const RtStFile *f, const char *key);    /* value for key, or NULL */
RtStatus rt_st_read_f32(const RtStFile *f, const RtStTensor *t, float *dst, int64_t n,
                        RtError *err); /* F32/F16/BF16/F64 -> f32; n must be numel */
RtStatus rt_st_read_i64(const RtStFile *f, const RtStTensor *t, int64_t *dst, int64_t n, RtError *err); /* I32/I64 -> i64 */
RtStatus rt_st_read_i32(const RtStFile *f, const RtStTensor *t, int32_t *dst, int64_t n,
                        RtError *err); /* I32, or I64 within int32's range -> i32 */
RtStatus rt_st_read_raw(const RtStFile *f, const RtStTensor *t, void *dst, int64_t n,
                        RtError *err); /* any dtype: n elements' little-endian bytes as stored */

/* A tensor to write. `data` holds numel elements of dtype, little-endian, or - when from_f32 is
 * set (dtype F32, F16 or BF16) - numel floats converted with round-to-nearest-even on the way. */
typedef struct RtStEntry {
    const char *name;
    RtDtype dtype;
    int rank;
    const int64_t *shape;
    const void *data;
    int from_f32;
} RtStEntry;

typedef struct RtStMeta {
    const char *key;
    const char *value;
} RtStMeta;

RtStatus rt_st_write(const char *path, const RtStEntry *t, int64_t n, const RtStMeta *meta, int64_t nmeta,
                     RtError *err); /* atomic; byte-identical to the reference serializer without metadata */

/* Conversions (bit patterns as uint16_t). */
float rt_bf16_to_f32(uint16_t h); /* exact */
uint16_t rt_f32_to_bf16(float f); /* round to nearest, ties to even; NaN stays NaN */
float rt_f16_to_f32(uint16_t h);  /* exact, subnormals included */
uint16_t rt_f32_to_f16(float f);  /* round to nearest, ties to even; overflow to inf; NaN stays NaN */

/* ==== JSON (json.c) =========================================================================== */

/* The runtime's one reader and one writer of JSON, over Debian's jansson 2.14 (linked statically
 * into executables). Documents are jansson's json_t: a file that builds or walks one includes
 * <jansson.h>; these functions add RtError messages, exact 64-bit integers and the text form. */
typedef struct json_t json_t;

/* Parses text[0, n) (one value; a key repeated in one object is an error). `at` is where text
 * starts in its file and `what` names the file in messages: "<what> at byte <at + offset>: <why>".
 * The caller owns *out (json_decref). */
RtStatus rt_json_parse(json_t **out, const void *text, size_t n, size_t at, const char *what, RtError *err);
const json_t *rt_json_get(const json_t *obj, const char *key); /* a member, or NULL (also when obj is not an object) */
int rt_json_i64(const json_t *v, int64_t *out);                /* 1 when v is an integer */
int rt_json_u64(const json_t *v, uint64_t *out); /* 1 when v is a non-negative integer or rt_json_new_u64's decimal string */
int rt_json_f64(const json_t *v, double *out);   /* 1 when v is a number */
const char *rt_json_str(const json_t *v);        /* the string, or NULL when v is not one */

json_t *rt_json_new_u64(uint64_t v); /* an integer; above INT64_MAX (past jansson's integers) a string of the decimal digits */
json_t *rt_json_new_f64(double v);   /* a real; null for NaN and infinities, which JSON cannot hold */
int rt_json_valid_utf8(const char *s,
                       int *nomem); /* 1 when s is UTF-8 that a JSON string may hold; *nomem says a 0 was for lack of memory */
/* The text of v (malloc'd; NULL when out of memory): jansson's encoder with its flags
 * (JSON_COMPACT, JSON_INDENT(n), JSON_REAL_PRECISION(n)), members in insertion order, \u escapes
 * in lower case as serde_json and Python write them. *len (may be NULL) gets its length. */
char *rt_json_text(const json_t *v, size_t flags, size_t *len);

#endif
