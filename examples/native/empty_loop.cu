// A launch-bound loop: N empty kernels (argv[1], default 100000), then one synchronize.
// Prints the loop's own time (first launch to the end of the synchronize).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void empty() {}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  empty<<<1, 1>>>();  // context and module loaded before the clock starts
  cudaDeviceSynchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) empty<<<1, 1>>>();
  cudaDeviceSynchronize();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("launched %d empty kernels in %.6f s (%.3f us each)\n", n + 1, s, s / n * 1e6);
  return 0;
}
