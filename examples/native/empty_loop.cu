// A launch-bound loop: N empty kernels (argv[1], default 100000), then one synchronize.
// Prints the loop's own time (first launch to the end of the synchronize).  With argv[2] = R
// (default 1) the loop runs R times, one line each; PP_LOOP_THREADS=1 then prints each of the
// process's threads' CPU time (a benchmark's view of which thread the time went to).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <dirent.h>

__global__ void empty() {}

// name, user + system ticks and last CPU of every thread of this process (/proc/self/task)
static void print_threads() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char path[300], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char* open = strchr(buf, '(');
    char* close = strrchr(buf, ')');
    if (!open || !close) continue;
    *close = 0;
    // fields after the name: 3 state ... 14 utime 15 stime ... 39 processor
    long long v[40] = {0};
    char* p = close + 2;
    for (int field = 3; field < 40 && p && *p; ++field) {
      v[field] = strtoll(p + (field == 3), nullptr, 10);
      p = strchr(p, ' ');
      if (p) ++p;
    }
    printf("thread %s %s cpu_ticks %lld last_cpu %lld\n", e->d_name, open + 1, v[14] + v[15], v[39]);
  }
  closedir(d);
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  int repeats = argc > 2 ? atoi(argv[2]) : 1;
  empty<<<1, 1>>>();  // context and module loaded before the clock starts
  cudaDeviceSynchronize();
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) empty<<<1, 1>>>();
    cudaDeviceSynchronize();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("launched %d empty kernels in %.6f s (%.3f us each)\n", r ? n : n + 1, s, s / n * 1e6);
  }
  const char* threads = getenv("PP_LOOP_THREADS");
  if (threads && strcmp(threads, "1") == 0) print_threads();
  return 0;
}
