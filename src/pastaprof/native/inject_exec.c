/* pastaprof's injection library (inject.c): a program that execs another image.
 *
 * exec replaces the process's image without running atexit handlers, so what the capture still
 * holds -- CUPTI's buffer being filled, the callback rows since the last drain -- would be lost
 * (a program of 40 kernels that exec'd one of 25 stored 25).  `pastaprof run` puts this library
 * in LD_PRELOAD as well as in CUDA_INJECTION64_PATH, so the exec family of the program resolves
 * here: a capturing process writes everything and marks its files complete ("exec") before the
 * real call; the new image (the same pid) writes files of its own (inject_files.c).  Where exec
 * fails, the files are marked as not ended and capture goes on.  In every other process (not
 * capturing: a shell, a forked child, a Python program) these are the C library's calls.
 *
 * system(), popen() and posix_spawn() start another process and leave this one as it is.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#include "inject.h"

#define EXPORT __attribute__((visibility("default")))

typedef int (*execve_t)(const char*, char* const[], char* const[]);
typedef int (*execv_t)(const char*, char* const[]);
typedef int (*fexecve_t)(int, char* const[], char* const[]);
typedef int (*execveat_t)(int, const char*, char* const[], char* const[], int);

int execveat(int dirfd, const char* path, char* const argv[], char* const envp[], int flags);

/* The C library's functions, resolved once when the library loads (pp_exec_resolve, from its
 * constructor): never later, since the exec of a forked or vforked child of a multithreaded
 * program must not enter the dynamic loader (another thread may have held its lock at the fork). */
static execve_t real_execve, real_execvpe;
static execv_t real_execv, real_execvp;
static fexecve_t real_fexecve;
static execveat_t real_execveat;

void pp_exec_resolve(void) {
  real_execve = (execve_t)dlsym(RTLD_NEXT, "execve");
  real_execvpe = (execve_t)dlsym(RTLD_NEXT, "execvpe");
  real_execv = (execv_t)dlsym(RTLD_NEXT, "execv");
  real_execvp = (execv_t)dlsym(RTLD_NEXT, "execvp");
  real_fexecve = (fexecve_t)dlsym(RTLD_NEXT, "fexecve");
  real_execveat = (execveat_t)dlsym(RTLD_NEXT, "execveat");
}

/* Each wrapper: the capture written, the real call, and (it returned: it failed) capture on. */
#define THROUGH(real, ...)       \
  do {                           \
    if (!real) {                 \
      errno = ENOSYS;            \
      return -1;                 \
    }                            \
    int ours = pp_before_exec(); \
    int r = real(__VA_ARGS__);   \
    int e = errno;               \
    pp_exec_failed(ours);        \
    errno = e;                   \
    return r;                    \
  } while (0)

EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  THROUGH(real_execve, path, argv, envp);
}
EXPORT int execv(const char* path, char* const argv[]) { THROUGH(real_execv, path, argv); }
EXPORT int execvp(const char* file, char* const argv[]) { THROUGH(real_execvp, file, argv); }
EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  THROUGH(real_execvpe, file, argv, envp);
}
EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) { THROUGH(real_fexecve, fd, argv, envp); }
EXPORT int execveat(int dirfd, const char* path, char* const argv[], char* const envp[], int flags) {
  THROUGH(real_execveat, dirfd, path, argv, envp, flags);
}

/* The list forms: their arguments into an array (on the stack, as the C library does), then
 * the array form above.  `ap` is just after `first`. */
static size_t list_length(const char* first, va_list ap) {
  if (!first) return 0;
  va_list c;
  va_copy(c, ap);
  size_t n = 1;
  while (va_arg(c, const char*)) ++n;
  va_end(c);
  return n;
}

typedef int (*array_form_t)(const char*, char* const[], char* const[]);
static int as_v(const char* path, char* const argv[], char* const envp[]) { (void)envp; return execv(path, argv); }
static int as_vp(const char* file, char* const argv[], char* const envp[]) { (void)envp; return execvp(file, argv); }

static int by_list(const char* target, const char* first, va_list ap, int with_env, array_form_t array_form) {
  va_list c;
  va_copy(c, ap);
  size_t n = list_length(first, ap);
  char* argv[n + 1];
  for (size_t i = 0; i < n; ++i) argv[i] = i ? va_arg(c, char*) : (char*)first;
  if (n) (void)va_arg(c, char*); /* the list's NULL */
  argv[n] = NULL;
  char** envp = with_env ? va_arg(c, char**) : NULL;
  va_end(c);
  return array_form(target, argv, envp);
}

EXPORT int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  int r = by_list(path, arg, ap, 0, as_v);
  va_end(ap);
  return r;
}
EXPORT int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  int r = by_list(file, arg, ap, 0, as_vp);
  va_end(ap);
  return r;
}
EXPORT int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  int r = by_list(path, arg, ap, 1, execve);
  va_end(ap);
  return r;
}
