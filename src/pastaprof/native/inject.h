/* The record files of pastaprof's injection library (inject.c), read by
 * handlers/native_program.py (keep the two in step: PP_FORMAT_VERSION).
 *
 * Per process, in $PASTAPROF_OUT/native/:
 *   rank-R-pid-P.rec   a header record, then records of PP_RECORD_WORDS int64 each: word 0 the
 *                      kind (PP_KERNEL...), words 1.. the kind's fields in the order below;
 *   rank-R-pid-P.str   strings (kernel, API, NVTX range and domain names): int32 id, int32
 *                      length, the bytes; a record names a string by id (-1: none), and a
 *                      string is always written before the first record that names it;
 *   rank-R-pid-P.json  the process: pid, rank, argv, settings, counts, how it ended.
 * A file cut short (a process killed mid-write) loses only its last, partial entry.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define PP_MAGIC 0x31564954414e5050LL /* "PPNATIV1" */
#define PP_FORMAT_VERSION 1
#define PP_RECORD_WORDS 16
#define PP_RECORD_BYTES (PP_RECORD_WORDS * 8)
#define PP_MAX_STRING 4096
#define PP_MAX_CBID 4096

enum {
  /* start end device stream correlation name grid_x grid_y grid_z block_x block_y block_z registers shared_bytes */
  PP_KERNEL = 1,
  /* start end device stream correlation bytes copy_kind */
  PP_MEMCPY = 2,
  /* start end device stream correlation bytes */
  PP_MEMSET = 3,
  /* start end stream correlation sync_type */
  PP_SYNC = 4,
  /* start end pid tid correlation cbid is_driver name */
  PP_API = 5,
  /* start device stream correlation address bytes memory_kind operation pid is_async */
  PP_MEMORY = 6,
  /* start flags id object_kind pid tid name domain */
  PP_MARKER = 7,
  /* start end counter_kind value address src_id dst_id stream flags pid  (--uvm: inject_cupti.c) */
  PP_UVM = 8,
};

enum {
  PP_STAT_RECORDS, PP_STAT_WRITTEN, PP_STAT_KERNELS_SEEN, PP_STAT_SAMPLED_OUT, PP_STAT_DROPPED, PP_STAT_BUFFERS,
  PP_STAT_WRITE_ERRORS, PP_STAT_PID, PP_STAT_API_ENABLED, PP_STAT_CB_ROWS, PP_STAT_CB_DROPPED, PP_NSTATS
};
#define PP_STAT_NAMES \
  {"records", "written", "kernels_seen", "sampled_out", "dropped", "buffers", "write_errors", "pid", "api_calls_enabled", \
   "callback_rows", "callback_dropped"}

/* rank-R-pid-P.san (instruction-level tools, inject_sanitizer.c): chunks of
 *   int64 PP_SAN_MAGIC, PP_SAN_TABLES, new names, names before them, ncols[PP_SAN_TABLES], rows[PP_SAN_TABLES];
 *   each table's columns (ncols x rows int64, column after column, empty tables skipped);
 *   raw request addresses (rows[PP_SAN_T_RAW] x 32 uint64);
 *   per new kernel name: int32 length, mangled bytes, int32 length, readable bytes.
 * The tables are sanitizer_tool.cpp's (pp_san_take / pp_san_copy), in handlers/sanitizer.py's order. */
#define PP_SAN_MAGIC 0x31484e4153505050LL /* "PPPSANH1" */
#define PP_SAN_TABLES 7
#define PP_SAN_T_RAW 4
#define PP_SAN_NCOLS {32, 11, 1, 8, 8, 4, 7}

#include <stdio.h>
int pp_bridge_start(const char* base, const char* kernels, long sample, char* err, size_t errlen);
void pp_bridge_drain(void);
void pp_bridge_copies(void);
void pp_bridge_meta(FILE* f, void (*json_string)(FILE*, const char*, size_t));

/* inject.c, for inject_selftest.c */
int pp_test_begin(void);
int pp_test_named(void);
void pp_decode(const void* record);
void pp_test_end(void);
int pp_test_buffers(void);

/* inject_util.c: names (under inject.c's lock) and settings */
int pp_names_alloc(void);
int32_t pp_intern(const char* s);
int32_t pp_kernel_name(const char* name);
int pp_kernel_selected(int32_t id);
int32_t pp_api_name(int driver, uint32_t cbid, const char* (*lookup)(int, uint32_t));
int pp_names_filter(const char* pattern); /* 1: a POSIX ERE, applied here; 2: left to the reader */
void pp_names_demangler(int load);
const char* pp_names_staged(size_t* n);
void pp_names_forget_staged(void);
int pp_env_rank(void);
int pp_rank_selected(int rank);
int pp_off(const char* part);

/* inject.c, for inject_exits.c */
int pp_capturing(void);
int pp_poll_ms(void);
void pp_finish(const char* how);
void pp_drain_periodic(void);
void pp_last_words(const char* how);
void pp_test_hold(int begin); /* inject.c, for inject_selftest.c */
/* inject.c, for inject_exec.c */
int pp_before_exec(void);
void pp_exec_failed(int was_capturing);
void pp_exec_resolve(void); /* inject_exec.c, for inject.c's constructor */
/* inject_exits.c */
void pp_start_flusher(void);
void pp_install_signals(void);
void pp_exits_forked(void);
