/* A native program's files in $PASTAPROF_OUT/native/: the record and string files, and the
 * JSON header (run.json's source for this process), rewritten atomically.  Part of the
 * injection library (inject.c). */
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "inject.h"
#include "inject_state.h"

/* ---- the process's files -------------------------------------------------------------------- */
int64_t pp_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Length of the UTF-8 sequence at s (at most n bytes), or 0 when it is not one. */
static size_t utf8_len(const unsigned char* s, size_t n) {
  size_t len = s[0] >= 0xf0 && s[0] < 0xf5 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
  if (!len || len > n) return 0;
  for (size_t i = 1; i < len; ++i)
    if ((s[i] & 0xc0) != 0x80) return 0;
  return len;
}

/* A JSON string: valid UTF-8 kept, control characters and other bytes escaped (an invalid
 * byte becomes the code point of its value): never invalid JSON, whatever argv holds. */
void pp_json_string(FILE* f, const char* s, size_t n) {
  fputc('"', f);
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = (unsigned char)s[i];
    size_t len = c >= 0x80 ? utf8_len((const unsigned char*)s + i, n - i) : 0;
    if (len) {
      fwrite(s + i, 1, len, f);
      i += len - 1;
    } else if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

void pp_write_meta(int complete) {
  char path[4300], tmp[4300];
  snprintf(path, sizeof path, "%s.json", g_base);
  snprintf(tmp, sizeof tmp, "%s.json.tmp", g_base);
  FILE* f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "{\"format\": \"pastaprof-native\", \"version\": %d, \"record_bytes\": %d, \"pid\": %d, \"rank\": %d, ",
          PP_FORMAT_VERSION, PP_RECORD_BYTES, (int)getpid(), g_rank);
  fprintf(f, "\"started_ns\": %lld, \"updated_ns\": %lld, \"complete\": %s, \"ended\": ", (long long)g_started_ns,
          (long long)pp_now_ns(), complete ? "true" : "false");
  pp_json_string(f, g_ended, strlen(g_ended));
  fprintf(f, ", \"mode\": \"%s\", \"sample\": %lld, \"kernel_filter\": \"%s\", \"status\": ", g_mode,
          (long long)g_sample, g_kernel_filter == 1 ? "posix" : g_kernel_filter == 2 ? "python" : "none");
  pp_json_string(f, g_status, strlen(g_status));
  if (g_note[0]) {
    fputs(", \"note\": ", f);
    pp_json_string(f, g_note, strlen(g_note));
  }
  if (g_knobs[0]) {
    fputs(", \"knobs\": ", f);
    pp_json_string(f, g_knobs, strlen(g_knobs));
  }
  pp_cb_meta(f); /* "api_mechanism", "lazy_kinds" */
  if (g_uvm_status[0]) {
    fputs(", \"uvm\": ", f);
    pp_json_string(f, g_uvm_status, strlen(g_uvm_status));
  }
  if (g_san_status[0]) {
    fputs(", \"sanitizer_status\": ", f);
    pp_json_string(f, g_san_status, strlen(g_san_status));
  }
  pp_bridge_meta(f, pp_json_string);
  static const char* names[PP_NSTATS] = PP_STAT_NAMES;
  fprintf(f, ", \"stats\": {");
  for (int i = 0; i < PP_NSTATS; ++i) fprintf(f, "%s\"%s\": %lld", i ? ", " : "", names[i], (long long)g_stat[i]);
  fprintf(f, "}, \"argv\": [");
  int fd = open("/proc/self/cmdline", O_RDONLY);
  if (fd >= 0) {
    char buf[8192];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    for (ssize_t i = 0, first = 1; n > 0 && i < n; first = 0) {
      size_t len = strnlen(buf + i, (size_t)(n - i));
      if (!first) fputs(", ", f);
      pp_json_string(f, buf + i, len);
      i += (ssize_t)len + 1;
    }
  }
  fputs("]}\n", f);
  if (fclose(f) == 0) rename(tmp, path);
  else unlink(tmp);
}

int pp_open_files(void) {
  const char* out = getenv("PASTAPROF_OUT");
  if (!out || !*out) {
    snprintf(g_status, sizeof g_status, "PASTAPROF_OUT is not set");
    return -1;
  }
  snprintf(g_dir, sizeof g_dir, "%s/native", out);
  mkdir(out, 0777);
  if (mkdir(g_dir, 0777) != 0 && errno != EEXIST) {
    snprintf(g_status, sizeof g_status, "cannot create %.400s: %s", g_dir, strerror(errno));
    return -1;
  }
  snprintf(g_base, sizeof g_base, "%s/rank-%d-pid-%d", g_dir, g_rank, (int)getpid());
  char path[4300];
  /* a process that exec'd keeps its pid: the earlier image's files stay, this one's are -exec-N */
  snprintf(path, sizeof path, "%s.rec", g_base);
  for (int n = 1; access(path, F_OK) == 0 && n < 10000; ++n) {
    snprintf(g_base, sizeof g_base, "%s/rank-%d-pid-%d-exec-%d", g_dir, g_rank, (int)getpid(), n);
    snprintf(path, sizeof path, "%s.rec", g_base);
  }
  snprintf(path, sizeof path, "%s.rec", g_base);
  g_rec_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0666);
  snprintf(path, sizeof path, "%s.str", g_base);
  g_str_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0666);
  if (g_rec_fd < 0 || g_str_fd < 0) {
    snprintf(g_status, sizeof g_status, "cannot write in %.400s: %s", g_dir, strerror(errno));
    return -1;
  }
  int64_t header[PP_RECORD_WORDS] = {PP_MAGIC, PP_FORMAT_VERSION, PP_RECORD_BYTES, getpid(), 0};
  header[4] = g_rank;
  pp_write_all(g_rec_fd, header, sizeof header);
  return 0;
}
