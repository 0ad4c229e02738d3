/* `mallocs N SIZE` calls malloc exactly N times (SIZE bytes each, freed at once) and
 * prints with write(2), which mallocs nothing: a known call count for a uprobe on malloc. */
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100;
    size_t size = argc > 2 ? (size_t)atol(argv[2]) : 12345;
    for (long i = 0; i < n; i++) {
        void *volatile p = malloc(size);
        free(p);
    }
    static const char done[] = "mallocs done\n";
    return write(1, done, sizeof done - 1) == (ssize_t)(sizeof done - 1) ? 0 : 1;
}
