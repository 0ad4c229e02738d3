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
};

enum {
  PP_STAT_RECORDS, PP_STAT_WRITTEN, PP_STAT_KERNELS_SEEN, PP_STAT_SAMPLED_OUT, PP_STAT_DROPPED, PP_STAT_BUFFERS,
  PP_STAT_WRITE_ERRORS, PP_STAT_PID, PP_STAT_API_ENABLED, PP_NSTATS
};
#define PP_STAT_NAMES \
  {"records", "written", "kernels_seen", "sampled_out", "dropped", "buffers", "write_errors", "pid", "api_calls_enabled"}
