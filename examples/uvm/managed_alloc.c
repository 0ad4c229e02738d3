/* A PyTorch pluggable allocator on unified memory (examples/uvm/torch_managed.py).
 *
 * Every CUDA tensor gets cudaMallocManaged memory from the CUDA runtime PyTorch already
 * loaded (found with dlopen(RTLD_NOLOAD), so no CUDA headers or second runtime), and is
 * freed with cudaFree.  No caching: each allocation is a driver call, which is fine for
 * an example with few large tensors.  pp_ballast takes plain device memory, to leave
 * the managed working set less GPU memory than it needs (oversubscription). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <sys/types.h>

typedef int (*malloc_managed_t)(void**, size_t, unsigned int);
typedef int (*malloc_t)(void**, size_t);
typedef int (*free_t)(void*);

static malloc_managed_t p_malloc_managed;
static long long live_bytes, peak_bytes; /* managed bytes held by PyTorch now / at most */
static malloc_t p_malloc;
static free_t p_free;

static int resolve(void) {
  if (p_malloc_managed && p_free) return 1;
  static const char* names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", 0};
  void* h = 0;
  for (int i = 0; names[i] && !h; ++i) h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = RTLD_DEFAULT;
  p_malloc_managed = (malloc_managed_t)dlsym(h, "cudaMallocManaged");
  p_malloc = (malloc_t)dlsym(h, "cudaMalloc");
  p_free = (free_t)dlsym(h, "cudaFree");
  return p_malloc_managed && p_free;
}

/* cudaMemAttachGlobal = 1: any stream may access it. */
void* pp_managed_malloc(ssize_t size, int device, void* stream) {
  (void)device;
  (void)stream;
  void* p = 0;
  if (size <= 0 || !resolve() || p_malloc_managed(&p, (size_t)size, 1) != 0) return 0;
  live_bytes += size; /* PyTorch calls the allocator under its own lock */
  if (live_bytes > peak_bytes) peak_bytes = live_bytes;
  return p;
}

void pp_managed_free(void* ptr, ssize_t size, int device, void* stream) {
  (void)device;
  (void)stream;
  if (ptr && resolve()) {
    p_free(ptr);
    live_bytes -= size;
  }
}

void* pp_ballast(size_t size) {
  void* p = 0;
  if (!resolve() || !p_malloc || p_malloc(&p, size) != 0) return 0;
  return p;
}

int pp_resolved(void) { return resolve(); }

/* The most managed memory PyTorch held at once (sizes the oversubscription ballast). */
long long pp_peak_bytes(void) { return peak_bytes; }
