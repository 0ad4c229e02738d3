/* Instruction-level tools on native programs: inject.c's bridge to pastaprof's Compute
 * Sanitizer tool (sanitizer_tool.cpp, the same library and device patches a Python session
 * drives through ctypes).
 *
 * When `pastaprof run -t working_set,...` starts a native program, the launcher sets
 * PASTAPROF_NATIVE_SANITIZER (the tool's .so), PASTAPROF_NATIVE_SANITIZER_PATCH (its fatbin)
 * and PASTAPROF_NATIVE_SANITIZER_ARGS ("mode,page_shift,pc_cap,page_cap,raw_cap,flags,shards",
 * what the Python handler passes to pp_san_configure).  At cuInit this file loads the tool and
 * starts it from inside CUDA's injection call (as compute-sanitizer's own tools start).  What
 * the Python handler would drain -- the tool's tables (pp_san_take / pp_san_copy), raw request
 * addresses and new kernel names -- is written as chunks to rank-R-pid-P.san (layout: inject.h)
 * at each CUPTI buffer, every flush period and at exit; handlers/native_program.py replays the
 * chunks through the Python handler's own drain, so the tables are the same as a Python
 * program's.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inject.h"

typedef int (*configure_t)(int, const char*, const char*, long, int, long, long, long, int);
typedef void (*int_fn_t)(int);
typedef void (*str_fn_t)(const char*);
typedef int (*init_t)(void);
typedef const char* (*err_t)(void);
typedef void (*take_t)(int64_t*);
typedef void (*copy_t)(int, int, int64_t*);
typedef void (*addr_t)(uint64_t*);
typedef int64_t (*count_t)(void);
typedef const char* (*name_t)(int64_t);
typedef int64_t (*demangle_t)(const char*, char*, int64_t);
typedef int64_t (*stat_t)(int);

static int (*p_record_copies)(int);
static struct {
  take_t take;
  copy_t copy;
  addr_t addresses;
  count_t name_count;
  name_t name;
  demangle_t demangle;
  stat_t stat;
  err_t error;
  count_t notes;
  name_t note;
} S;
static int g_fd = -1;
static int64_t g_names_sent;
static int64_t g_chunks;

static const int64_t NCOLS[PP_SAN_TABLES] = PP_SAN_NCOLS;

static int write_all(const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n > 0) {
    ssize_t w = write(g_fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Load and start the tool.  0, or -1 with the reason in err (capture of the rest goes on). */
int pp_bridge_start(const char* base, const char* kernels, long sample, char* err, size_t errlen) {
  const char* path = getenv("PASTAPROF_NATIVE_SANITIZER");
  const char* patch = getenv("PASTAPROF_NATIVE_SANITIZER_PATCH");
  const char* args = getenv("PASTAPROF_NATIVE_SANITIZER_ARGS");
  if (!path || !*path) return 1; /* not asked for */
  long a[7] = {1, 12, 4096, 1 << 22, 1 << 20, 31, 16};
  if (args) sscanf(args, "%ld,%ld,%ld,%ld,%ld,%ld,%ld", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6]);
  void* h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    snprintf(err, errlen, "sanitizer tool not loadable: %.300s", dlerror());
    return -1;
  }
  configure_t configure = (configure_t)dlsym(h, "pp_san_configure");
  int_fn_t shards = (int_fn_t)dlsym(h, "pp_san_set_shards");
  str_fn_t cubins = (str_fn_t)dlsym(h, "pp_san_set_cubin_dir");
  init_t init = (init_t)dlsym(h, "InitializeInjection");
  p_record_copies = (int (*)(int))dlsym(h, "pp_san_record_copies");
  S.take = (take_t)dlsym(h, "pp_san_take");
  S.copy = (copy_t)dlsym(h, "pp_san_copy");
  S.addresses = (addr_t)dlsym(h, "pp_san_copy_addresses");
  S.name_count = (count_t)dlsym(h, "pp_san_name_count");
  S.name = (name_t)dlsym(h, "pp_san_name");
  S.demangle = (demangle_t)dlsym(h, "pp_san_demangle");
  S.stat = (stat_t)dlsym(h, "pp_san_stat");
  S.error = (err_t)dlsym(h, "pp_san_error");
  S.notes = (count_t)dlsym(h, "pp_san_notes");
  S.note = (name_t)dlsym(h, "pp_san_note");
  if (!configure || !init || !S.take || !S.copy || !S.addresses || !S.name_count || !S.name || !S.error) {
    snprintf(err, errlen, "sanitizer tool %.300s lacks pastaprof's entry points", path);
    S.take = NULL;
    return -1;
  }
  if (configure((int)a[0], patch ? patch : "", kernels ? kernels : "", sample, (int)a[1], a[2], a[3], a[4],
                (int)a[5]) != 0) {
    snprintf(err, errlen, "%.400s", S.error());
    S.take = NULL;
    return -1;
  }
  if (shards) shards((int)a[6]);
  const char* out = getenv("PASTAPROF_OUT");
  if (cubins && out) { /* module images with line info: PC -> source line, as for Python programs */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/_cubins", out);
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) cubins(dir);
  }
  char file[4300];
  snprintf(file, sizeof file, "%s.san", base);
  g_fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0666);
  if (g_fd < 0) {
    snprintf(err, errlen, "cannot write %.300s: %s", file, strerror(errno));
    S.take = NULL;
    return -1;
  }
  if (init() != 0) { /* sanitizerSubscribe: one subscriber per process */
    snprintf(err, errlen, "%.400s", S.error());
    S.take = NULL;
    return -1;
  }
  return 0;
}

/* Copies, memsets and synchronizations from the tool's API callbacks, where CUPTI could not be
 * had beside it (the Python handler's record_copies). */
void pp_bridge_copies(void) {
  if (S.take && p_record_copies) p_record_copies(1);
}

/* One chunk: what the tool collected since the last one (nothing is written when empty). */
void pp_bridge_drain(void) {
  if (!S.take || g_fd < 0) return;
  int64_t n[PP_SAN_TABLES] = {0};
  S.take(n);
  int64_t names = S.name_count() - g_names_sent;
  int64_t rows = 0;
  for (int t = 0; t < PP_SAN_TABLES; ++t) rows += n[t];
  if (!rows && names <= 0) return;
  int64_t head[4 + 2 * PP_SAN_TABLES] = {PP_SAN_MAGIC, PP_SAN_TABLES, names, g_names_sent};
  for (int t = 0; t < PP_SAN_TABLES; ++t) {
    head[4 + t] = NCOLS[t];
    head[4 + PP_SAN_TABLES + t] = n[t];
  }
  if (write_all(head, sizeof head) != 0) return;
  for (int t = 0; t < PP_SAN_TABLES; ++t) {
    if (!n[t]) continue;
    int64_t* col = (int64_t*)malloc((size_t)n[t] * 8);
    if (!col) return;
    for (int c = 0; c < NCOLS[t]; ++c) {
      S.copy(t, c, col);
      write_all(col, (size_t)n[t] * 8);
    }
    free(col);
  }
  if (n[PP_SAN_T_RAW]) {
    uint64_t* addrs = (uint64_t*)malloc((size_t)n[PP_SAN_T_RAW] * 32 * 8);
    if (addrs) {
      S.addresses(addrs);
      write_all(addrs, (size_t)n[PP_SAN_T_RAW] * 32 * 8);
      free(addrs);
    }
  }
  /* new names: int32 mangled length, bytes, int32 readable length, bytes */
  char readable[PP_MAX_STRING + 1];
  for (int64_t i = g_names_sent; i < g_names_sent + names; ++i) {
    const char* raw = S.name(i);
    int32_t len = (int32_t)strnlen(raw, PP_MAX_STRING);
    int32_t dlen = len;
    const char* shown = raw;
    if (S.demangle) {
      int64_t k = S.demangle(raw, readable, sizeof readable);
      if (k >= 0) {
        dlen = (int32_t)(k < PP_MAX_STRING ? k : PP_MAX_STRING);
        shown = readable;
      }
    }
    write_all(&len, 4);
    write_all(raw, (size_t)len);
    write_all(&dlen, 4);
    write_all(shown, (size_t)dlen);
  }
  g_names_sent += names;
  g_chunks++;
}

/* The tool's counters, error and notes, as JSON members of the process's header. */
void pp_bridge_meta(FILE* f, void (*json_string)(FILE*, const char*, size_t)) {
  if (!S.take) return;
  fprintf(f, ", \"sanitizer\": {\"chunks\": %lld, \"stats\": [", (long long)g_chunks);
  for (int i = 0; i < 13; ++i) fprintf(f, "%s%lld", i ? ", " : "", (long long)(S.stat ? S.stat(i) : -1));
  fprintf(f, "], \"error\": ");
  const char* e = S.error ? S.error() : "";
  json_string(f, e, strlen(e));
  fprintf(f, ", \"notes\": [");
  int64_t k = S.notes ? S.notes() : 0;
  for (int64_t i = 0; i < k && i < 50; ++i) {
    const char* s = S.note(i);
    if (i) fputs(", ", f);
    json_string(f, s, strlen(s));
  }
  fputs("]}", f);
}
