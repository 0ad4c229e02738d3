/* A tiny program with a USDT probe: `ticks K` fires pastaprof_demo:tick K times, with the
 * tick's index and its square as arguments, then mallocs nothing more and exits 0.
 *
 *   cc -O2 -o ticks ticks.c
 *   pastaprof run --probe usdt:./ticks:pastaprof_demo:tick:args=2 -- python3 -c \
 *       "import subprocess; subprocess.run(['./ticks', '1000'])"
 */
#include <stdlib.h>
#include <sys/sdt.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long k = argc > 1 ? atol(argv[1]) : 10;
    for (long i = 0; i < k; i++) {
        DTRACE_PROBE2(pastaprof_demo, tick, i, i * i);
    }
    static const char done[] = "ticks done\n";
    return write(1, done, sizeof done - 1) == (ssize_t)(sizeof done - 1) ? 0 : 1;
}
