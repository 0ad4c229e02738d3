// cuBLAS SGEMMs and cuFFT C2C transforms (argv[1] of each, default 20): library kernels whose
// number the program cannot know itself (compare with ncu's list of kernels).
#include <cstdio>
#include <cstdlib>
#include <cublas_v2.h>
#include <cufft.h>
#include <cuda_runtime.h>

int main(int argc, char** argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 20;
  const int m = 1024;
  float *a, *b, *c;
  cudaMalloc(&a, m * m * sizeof(float)); cudaMalloc(&b, m * m * sizeof(float)); cudaMalloc(&c, m * m * sizeof(float));
  cudaMemset(a, 0, m * m * sizeof(float)); cudaMemset(b, 0, m * m * sizeof(float));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 2; }
  float one = 1.0f, zero = 0.0f;
  for (int i = 0; i < reps; ++i) cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, a, m, b, m, &zero, c, m);
  const int nfft = 1 << 16;
  cufftComplex* x;
  cudaMalloc(&x, nfft * sizeof(cufftComplex));
  cudaMemset(x, 0, nfft * sizeof(cufftComplex));
  cufftHandle plan;
  if (cufftPlan1d(&plan, nfft, CUFFT_C2C, 1) != CUFFT_SUCCESS) { fprintf(stderr, "cufftPlan1d failed\n"); return 2; }
  for (int i = 0; i < reps; ++i) cufftExecC2C(plan, x, x, CUFFT_FORWARD);
  cudaDeviceSynchronize();
  printf("%d sgemm, %d fft, status %s\n", reps, reps, cudaGetErrorString(cudaGetLastError()));
  cufftDestroy(plan); cublasDestroy(h);
  cudaFree(a); cudaFree(b); cudaFree(c); cudaFree(x);
  return 0;
}
