/* pastaprof's injection library (inject.c): interned names and the settings it parses.
 *
 * Names (kernels, API calls, NVTX ranges and domains) are interned once and staged for the
 * process's .str file; a record names a string by id.  Kernel names are looked up by CUPTI's
 * name pointer first (one per function), checked against the name itself.  All of it runs
 * under inject.c's lock.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <regex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inject.h"

#define STR_SLOTS (1u << 18)
typedef struct {
  uint64_t hash;
  int32_t id;
} StrSlot;
static StrSlot* g_str;
static char** g_strings;
static int32_t g_nstrings;
/* kernel name pointers (stable per function in CUPTI) -> string id */
#define PTR_SLOTS (1u << 16)
static const char** g_ptr_key;
static char** g_ptr_raw; /* the name a pointer had: a pointer CUPTI reuses for another name is told apart */
static int32_t* g_ptr_id;
static signed char* g_selected; /* per string id: -1 unknown, 0 no, 1 yes (kernel filter) */
static int32_t g_capselected;
static int32_t g_api_name[2][PP_MAX_CBID]; /* string id + 1 of (driver?, cbid) */
static char* g_strstage; /* strings interned since the last pp_names_staged() */
static size_t g_nstrstage, g_capstrstage;
static regex_t g_kernel_re;
static int g_kernel_filter;

static uint64_t fnv(const char* s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; ++s) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h | 1;
}

static void stage_string(int32_t id, const char* s, uint32_t len) {
  size_t need = g_nstrstage + 8 + len;
  if (need > g_capstrstage) {
    size_t cap = g_capstrstage ? g_capstrstage : 65536;
    while (cap < need) cap *= 2;
    char* p = (char*)realloc(g_strstage, cap);
    if (!p) return;
    g_strstage = p;
    g_capstrstage = cap;
  }
  memcpy(g_strstage + g_nstrstage, &id, 4);
  memcpy(g_strstage + g_nstrstage + 4, &len, 4);
  memcpy(g_strstage + g_nstrstage + 8, s, len);
  g_nstrstage = need;
}

/* id of string s (copied), or -1 when s is NULL or the table is full */
int32_t pp_intern(const char* s) {
  if (!s || !g_str) return -1;
  uint64_t h = fnv(s);
  for (uint32_t i = 0; i < STR_SLOTS; ++i) {
    StrSlot* slot = &g_str[(h + i) & (STR_SLOTS - 1)];
    if (slot->hash == h && strcmp(g_strings[slot->id], s) == 0) return slot->id;
    if (slot->hash == 0) {
      if (g_nstrings >= (int32_t)(STR_SLOTS / 2)) return -1;
      size_t len = strlen(s);
      if (len > PP_MAX_STRING) len = PP_MAX_STRING;
      char* copy = (char*)malloc(len + 1);
      if (!copy) return -1;
      memcpy(copy, s, len);
      copy[len] = 0;
      g_strings[g_nstrings] = copy;
      slot->hash = h;
      slot->id = g_nstrings;
      stage_string(g_nstrings, copy, (uint32_t)len);
      return g_nstrings++;
    }
  }
  return -1;
}

/* __cxa_demangle from the program's libstdc++, where it has one (nvcc programs do) */
typedef char* (*demangle_t)(const char*, char*, size_t*, int*);
static demangle_t p_demangle;

int32_t pp_kernel_name(const char* name) {
  if (!name) return -1;
  uint64_t h = (uint64_t)(uintptr_t)name * 0x9e3779b97f4a7c15ULL;
  for (uint32_t i = 0; i < PTR_SLOTS; ++i) {
    uint32_t s = (uint32_t)((h + i) & (PTR_SLOTS - 1));
    if (g_ptr_key[s] == name && strcmp(g_ptr_raw[s], name) == 0) return g_ptr_id[s];
    if (g_ptr_key[s] == NULL) {
      int status = -1;
      char* readable = (p_demangle && name[0] == '_' && name[1] == 'Z') ? p_demangle(name, NULL, NULL, &status) : NULL;
      int32_t id = pp_intern(status == 0 && readable ? readable : name);
      free(readable);
      g_ptr_raw[s] = strdup(name);
      if (!g_ptr_raw[s]) return id;
      g_ptr_key[s] = name;
      g_ptr_id[s] = id;
      return id;
    }
  }
  return pp_intern(name);
}

int pp_kernel_selected(int32_t id) {
  if (g_kernel_filter != 1 || id < 0) return 1;
  if (id >= g_capselected) {
    int32_t cap = g_capselected ? g_capselected : 1024;
    while (cap <= id) cap *= 2;
    signed char* p = (signed char*)realloc(g_selected, (size_t)cap);
    if (!p) return 1;
    memset(p + g_capselected, -1, (size_t)(cap - g_capselected));
    g_selected = p;
    g_capselected = cap;
  }
  if (g_selected[id] < 0) g_selected[id] = regexec(&g_kernel_re, g_strings[id], 0, NULL, 0) == 0;
  return g_selected[id];
}


int32_t pp_api_name(int driver, uint32_t cbid, const char* (*lookup)(int, uint32_t)) {
  if (cbid >= PP_MAX_CBID) return -1;
  if (g_api_name[driver][cbid]) return g_api_name[driver][cbid] - 1;
  const char* name = lookup ? lookup(driver, cbid) : NULL;
  char fallback[32];
  if (!name) {
    snprintf(fallback, sizeof fallback, "cbid_%u", cbid);
    name = fallback;
  }
  int32_t id = pp_intern(name);
  g_api_name[driver][cbid] = id + 1;
  return id;
}

int pp_names_alloc(void) {
  if (g_str) return 0;
  g_str = (StrSlot*)calloc(STR_SLOTS, sizeof(StrSlot));
  g_strings = (char**)calloc(STR_SLOTS / 2, sizeof(char*));
  g_ptr_key = (const char**)calloc(PTR_SLOTS, sizeof(char*));
  g_ptr_id = (int32_t*)calloc(PTR_SLOTS, sizeof(int32_t));
  g_ptr_raw = (char**)calloc(PTR_SLOTS, sizeof(char*));
  return (g_str && g_strings && g_ptr_key && g_ptr_id && g_ptr_raw) ? 0 : -1;
}

int pp_names_filter(const char* pattern) {
  g_kernel_filter = regcomp(&g_kernel_re, pattern, REG_EXTENDED | REG_NOSUB) == 0 ? 1 : 2;
  return g_kernel_filter;
}

void pp_names_demangler(int load) {
  p_demangle = (demangle_t)dlsym(RTLD_DEFAULT, "__cxa_demangle");
  if (!p_demangle && load) {
    void* cxx = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_GLOBAL);
    if (cxx) p_demangle = (demangle_t)dlsym(cxx, "__cxa_demangle");
  }
}

const char* pp_names_staged(size_t* n) {
  *n = g_nstrstage;
  g_nstrstage = 0; /* the caller writes them before anything else is interned (under its lock) */
  return g_strstage;
}

void pp_names_forget_staged(void) { g_nstrstage = 0; }

/* ---- settings: the PASTAPROF_* vocabulary of `pastaprof run` ---------------------------------- */
int pp_env_rank(void) {
  static const char* vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; ++i) {
    const char* v = getenv(vars[i]);
    if (v && *v && strspn(v, "0123456789") == strlen(v)) return atoi(v);
  }
  return 0;
}

/* PASTAPROF_RANKS "0,2-3": 1 when rank is listed (or nothing is set) */
int pp_rank_selected(int rank) {
  const char* s = getenv("PASTAPROF_RANKS");
  if (!s || !*s) return 1;
  while (*s) {
    char* end;
    long lo = strtol(s, &end, 10), hi = lo;
    if (end == s) return 1; /* the launcher validated it; a bad value selects everything */
    if (*end == '-') {
      s = end + 1;
      hi = strtol(s, &end, 10);
    }
    if (rank >= lo && rank <= hi) return 1;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') break;
  }
  return 0;
}

/* whether PASTAPROF_OFF lists `part` */
int pp_off(const char* part) {
  const char* s = getenv("PASTAPROF_OFF");
  size_t n = strlen(part);
  while (s && *s) {
    while (*s == ',' || *s == ' ') ++s;
    size_t len = strcspn(s, ",");
    while (len && s[len - 1] == ' ') --len;
    if (len == n && strncmp(s, part, n) == 0) return 1;
    s += len;
  }
  return 0;
}

