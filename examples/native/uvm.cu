// Unified memory, page by page: cudaMallocManaged, every page written on the host, a kernel
// that touches every page (each int incremented), the host reading every page back.
// Prints its own counts, so `pastaprof run --uvm` can be checked against them:
//   uvm: bytes=B pages=P page_bytes=4096 host_wrote=B kernel_touched=B host_read=B check ok
// argv[1]: MiB of managed memory (default 64).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <unistd.h>

__global__ void touch(int* p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] += 1;
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 64;
  size_t bytes = mib << 20, n = bytes / sizeof(int);
  long page = sysconf(_SC_PAGESIZE);
  int* p = nullptr;
  if (cudaMallocManaged(&p, bytes) != cudaSuccess) {
    fprintf(stderr, "uvm: cudaMallocManaged failed\n");
    return 1;
  }
  for (size_t i = 0; i < n; ++i) p[i] = (int)i;  // every page resident on the host first
  touch<<<1024, 256>>>(p, n);                     // GPU faults: every page migrates host -> device
  if (cudaDeviceSynchronize() != cudaSuccess) {
    fprintf(stderr, "uvm: kernel failed\n");
    return 1;
  }
  int ok = 1;
  for (size_t i = 0; i < n; ++i) ok &= p[i] == (int)i + 1;  // CPU faults: every page back device -> host
  printf("uvm: bytes=%zu pages=%zu page_bytes=%ld host_wrote=%zu kernel_touched=%zu host_read=%zu check %s\n", bytes,
         bytes / page, page, bytes, bytes, bytes, ok ? "ok" : "FAILED");
  cudaFree(p);
  return ok ? 0 : 1;
}
