// Vector add, launched N times (argv[1], default 50), with an NVTX range per 10 launches.
// Prints what it did, so `pastaprof run` can be checked against the program's own count:
//   launched K kernels, 2 HtoD + 1 DtoH copies, R NVTX ranges, check ok
// argv[2]: "abort" ends with abort() after the launches; "spin" keeps launching until killed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

__global__ void vecadd(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

int main(int argc, char** argv) {
  int launches = argc > 1 ? atoi(argv[1]) : 50;
  const char* mode = argc > 2 ? argv[2] : "";
  const int n = 1 << 20;
  size_t bytes = n * sizeof(float);
  float *ha = (float*)malloc(bytes), *hb = (float*)malloc(bytes), *hc = (float*)malloc(bytes);
  for (int i = 0; i < n; ++i) { ha[i] = (float)i; hb[i] = 2.0f * i; }
  float *a, *b, *c;
  cudaMalloc(&a, bytes); cudaMalloc(&b, bytes); cudaMalloc(&c, bytes);
  cudaMemcpy(a, ha, bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(b, hb, bytes, cudaMemcpyHostToDevice);
  int ranges = 0, k = 0;
  for (; k < launches || !strcmp(mode, "spin"); ++k) {
    if (k % 10 == 0) { nvtxRangePushA("ten launches"); ranges++; }
    vecadd<<<(n + 255) / 256, 256>>>(a, b, c, n);
    if (k % 10 == 9 || k == launches - 1) nvtxRangePop();
    if (!strcmp(mode, "spin") && k % 1000 == 999) cudaDeviceSynchronize();
  }
  cudaMemcpy(hc, c, bytes, cudaMemcpyDeviceToHost);
  int ok = 1;
  for (int i = 0; i < n; ++i) ok &= hc[i] == 3.0f * i;
  printf("launched %d kernels, 2 HtoD + 1 DtoH copies, %d NVTX ranges, check %s\n", k, ranges, ok ? "ok" : "FAILED");
  fflush(stdout);
  if (!strcmp(mode, "abort")) abort();
  cudaFree(a); cudaFree(b); cudaFree(c);
  free(ha); free(hb); free(hc);
  return ok ? 0 : 1;
}
