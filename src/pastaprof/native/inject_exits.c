/* pastaprof's injection library (inject.c): what happens when the program ends by a signal.
 *
 * SIGTERM, SIGINT, SIGHUP and SIGABRT (abort()) get a handler that has the library's own thread
 * flush (at most 3 s), then hands the signal on: to the program's handler, or, where the program
 * left the default action, by raising it again -- so exit codes and deaths by signal are what
 * they would be without pastaprof.  An ignored signal stays ignored.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "inject.h"

static const int SIGNALS[] = {SIGTERM, SIGINT, SIGHUP, SIGABRT};
#define NSIG_OURS 4
static struct sigaction g_prev[NSIG_OURS];
static volatile sig_atomic_t g_finishing;

/* The flusher thread: flushes for a signal handler (CUPTI must not be entered from the
 * interrupted thread, which may hold the driver's locks inside a launch: flushing there hung),
 * and, every PASTAPROF_FLUSH_MS, writes the callback rows (inject_callbacks.c) and drains the
 * sanitizer's tables. */
static int g_wake[2] = {-1, -1}, g_done[2] = {-1, -1};
static int g_have_flusher;
static char g_signal_how[32];

static void* flusher_main(void* arg) {
  (void)arg;
  for (;;) {
    struct pollfd p = {g_wake[0], POLLIN, 0};
    int r = poll(&p, 1, pp_poll_ms());
    if (r < 0) continue;
    char c = 0;
    if (r > 0 && read(g_wake[0], &c, 1) != 1) continue;
    if (!pp_capturing()) continue;
    if (c == 'S') {
      pp_finish(g_signal_how);
      if (write(g_done[1], "d", 1) < 0) continue;
    } else {
      pp_drain_periodic();
    }
  }
  return NULL;
}

void pp_start_flusher(void) {
  if (pipe2(g_wake, O_CLOEXEC) != 0 || pipe2(g_done, O_CLOEXEC) != 0) return;
  sigset_t all, old; /* the program's signals go to the program's threads, never to this one */
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pthread_t t;
  g_have_flusher = pthread_create(&t, NULL, flusher_main, NULL) == 0;
  if (g_have_flusher) pthread_detach(t);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void on_signal(int sig, siginfo_t* info, void* uc) {
  int i = 0;
  while (i < NSIG_OURS && SIGNALS[i] != sig) ++i;
  if (i == NSIG_OURS) return;
  if (!g_finishing && pp_capturing()) {
    g_finishing = 1;
    snprintf(g_signal_how, sizeof g_signal_how, "signal %d", sig);
    int done = 0; /* not final: the program's handler may go on running (and exit later) */
    if (g_have_flusher && write(g_wake[1], "S", 1) == 1) {
      struct pollfd p = {g_done[0], POLLIN, 0};
      char c;
      if (poll(&p, 1, 3000) > 0) done = read(g_done[0], &c, 1) == 1;
    }
    if (!done) pp_last_words(g_signal_how);
    g_finishing = 0;
  }
  struct sigaction* prev = &g_prev[i];
  if (prev->sa_flags & SA_SIGINFO) {
    if (prev->sa_sigaction) prev->sa_sigaction(sig, info, uc);
    return;
  }
  if (prev->sa_handler == SIG_IGN) return;
  if (prev->sa_handler == SIG_DFL) { /* the default action, as without pastaprof */
    sigaction(sig, prev, NULL);
    raise(sig); /* delivered when this handler returns (the signal is blocked in it) */
    return;
  }
  prev->sa_handler(sig);
}

void pp_install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < NSIG_OURS; ++i) {
    struct sigaction cur;
    if (sigaction(SIGNALS[i], NULL, &cur) != 0) continue;
    if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN) continue; /* ignored stays ignored */
    g_prev[i] = cur;
    sigaction(SIGNALS[i], &sa, NULL);
  }
}

void pp_exits_forked(void) { g_have_flusher = 0; }
