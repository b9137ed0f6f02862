/*
 * A small CUDA driver-API interposer, for a study (bench/gpu/shim/study.py): does refusing allocations inside
 * the process, below every framework, hold a kernel to its quota, at what cost, and how is it escaped?
 *
 * Loaded with LD_PRELOAD (or /etc/ld.so.preload), it wraps the driver's allocation calls and refuses one that
 * would take the process past its limit with CUDA_ERROR_OUT_OF_MEMORY, as the driver itself would. The limit:
 * GPUSHARE_SHIM_LIMIT_MIB, else a root-written file named after the process's kernel cgroup
 * (<GPUSHARE_SHIM_DIR or /run/jupyter-gpushare/limits>/<kernel id>, the id from /proc/self/cgroup's
 * ".../gpushare-kernels/<id>"), else no limit. Per process: a kernel's children each get the whole limit.
 *
 * The CUDA runtime does not call the driver's functions by name: it asks cuGetProcAddress for them, and finds
 * cuGetProcAddress itself with dlsym on libcuda's handle, which a preloaded library's symbols do not shadow. So
 * dlsym is wrapped too (the real one found with dlvsym), and so is cuGetProcAddress, to hand out the wrappers.
 * Build: gcc -O2 -shared -fPIC -I/usr/local/cuda/include gpushare_shim.c -o libgpushare_shim.so -ldl -lpthread
 */
#define _GNU_SOURCE
#include <cuda.h>
#undef cuGetProcAddress /* cuda.h names the _v2 call so; the first one is wrapped too */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024ULL * 1024ULL)
#define SLOTS (1 << 16)

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;
static void *libcuda;
static unsigned long long limit_bytes; /* 0: no limit */
static unsigned long long used_bytes;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct { unsigned long long key, size; } table[SLOTS]; /* address or handle -> size */

static void find_limit(void) {
  const char *env = getenv("GPUSHARE_SHIM_LIMIT_MIB");
  if (env && *env) {
    limit_bytes = strtoull(env, NULL, 10) * MIB;
    return;
  }
  FILE *f = fopen("/proc/self/cgroup", "r");
  char line[4096], id[128] = "";
  while (f && fgets(line, sizeof line, f)) {
    char *at = strstr(line, "/gpushare-kernels/");
    if (at && sscanf(at + strlen("/gpushare-kernels/"), "%127[0-9A-Za-z._-]", id) == 1) break;
  }
  if (f) fclose(f);
  if (!*id) return;
  const char *dir = getenv("GPUSHARE_SHIM_DIR");
  snprintf(line, sizeof line, "%s/%s", dir && *dir ? dir : "/run/jupyter-gpushare/limits", id);
  f = fopen(line, "r");
  unsigned long long mib = 0;
  if (f && fscanf(f, "%llu", &mib) == 1) limit_bytes = mib * MIB;
  if (f) fclose(f);
}

static dlsym_fn the_real_dlsym(void) { /* dlvsym, not dlsym: it never comes back here */
  if (!real_dlsym) real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!real_dlsym) real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  return real_dlsym;
}

static void init(void) { /* libcuda's own start may call dlsym: that path does not wait for this */
  the_real_dlsym();
  libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!libcuda) libcuda = dlopen("libcuda.so.1", RTLD_NOW);
  find_limit();
}

static void *real(const char *name) {
  pthread_once(&once, init);
  return libcuda ? real_dlsym(libcuda, name) : NULL;
}

/* -- bookkeeping ----------------------------------------------------------------------------------------------- */

static int take(size_t size) { /* 1: within the limit, counted */
  pthread_once(&once, init);
  pthread_mutex_lock(&lock);
  int ok = !limit_bytes || used_bytes + size <= limit_bytes;
  if (ok) used_bytes += size;
  pthread_mutex_unlock(&lock);
  return ok;
}

static void give(size_t size) {
  pthread_mutex_lock(&lock);
  used_bytes -= size < used_bytes ? size : used_bytes;
  pthread_mutex_unlock(&lock);
}

static void remember(unsigned long long key, size_t size) {
  pthread_mutex_lock(&lock);
  for (unsigned i = (key >> 12) % SLOTS, n = 0; n < SLOTS; i = (i + 1) % SLOTS, n++)
    if (!table[i].key) { table[i].key = key; table[i].size = size; break; }
  pthread_mutex_unlock(&lock);
}

static size_t forget(unsigned long long key) {
  size_t size = 0;
  pthread_mutex_lock(&lock);
  for (unsigned i = (key >> 12) % SLOTS, n = 0; n < SLOTS && table[i].key; i = (i + 1) % SLOTS, n++)
    if (table[i].key == key) { /* backward-shift delete keeps the probe chains whole */
      size = table[i].size;
      unsigned j = i;
      for (;;) {
        table[j].key = 0;
        unsigned k = j;
        for (;;) {
          k = (k + 1) % SLOTS;
          if (!table[k].key) goto done;
          unsigned home = (table[k].key >> 12) % SLOTS;
          if ((j < k) ? (home <= j || home > k) : (home <= j && home > k)) break;
        }
        table[j] = table[k];
        j = k;
      }
    }
done:
  pthread_mutex_unlock(&lock);
  return size;
}

/* -- the wrappers ------------------------------------------------------------------------------------------------ */

#define WRAP_ALLOC(name, params, args, size, key)                                \
  CUresult name params {                                                         \
    static CUresult(*fn) params;                                                 \
    if (!fn) fn = (CUresult(*) params)real(#name);                               \
    if (!take(size)) return CUDA_ERROR_OUT_OF_MEMORY;                            \
    CUresult r = fn args;                                                        \
    if (r == CUDA_SUCCESS) remember((unsigned long long)(key), size); else give(size); \
    return r;                                                                    \
  }

WRAP_ALLOC(cuMemAlloc_v2, (CUdeviceptr *p, size_t n), (p, n), n, *p)
WRAP_ALLOC(cuMemAllocManaged, (CUdeviceptr *p, size_t n, unsigned int f), (p, n, f), n, *p)
WRAP_ALLOC(cuMemAllocAsync, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s), n, *p)
WRAP_ALLOC(cuMemAllocFromPoolAsync, (CUdeviceptr *p, size_t n, CUmemoryPool m, CUstream s), (p, n, m, s), n, *p)
WRAP_ALLOC(cuMemCreate, (CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *a, unsigned long long f),
           (h, n, a, f), n, *h)

CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e) {
  static CUresult (*fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
  if (!fn) fn = (CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int))real("cuMemAllocPitch_v2");
  size_t guess = (w + 511) / 512 * 512 * h; /* the pitch is known only after: count a 512-byte aligned row */
  if (!take(guess)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = fn(p, pitch, w, h, e);
  if (r == CUDA_SUCCESS) remember(*p, guess); else give(guess);
  return r;
}

#define WRAP_FREE(name, params, args, key)                                       \
  CUresult name params {                                                         \
    static CUresult(*fn) params;                                                 \
    if (!fn) fn = (CUresult(*) params)real(#name);                               \
    CUresult r = fn args;                                                        \
    if (r == CUDA_SUCCESS) give(forget((unsigned long long)(key)));             \
    return r;                                                                    \
  }

WRAP_FREE(cuMemFree_v2, (CUdeviceptr p), (p), p)
WRAP_FREE(cuMemFreeAsync, (CUdeviceptr p, CUstream s), (p, s), p)
WRAP_FREE(cuMemRelease, (CUmemGenericAllocationHandle h), (h), h)

static const struct { const char *name; void *fn; } hooks[] = {
  {"cuMemAlloc", (void *)cuMemAlloc_v2},        {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
  {"cuMemAllocManaged", (void *)cuMemAllocManaged}, {"cuMemAllocAsync", (void *)cuMemAllocAsync},
  {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync}, {"cuMemCreate", (void *)cuMemCreate},
  {"cuMemAllocPitch", (void *)cuMemAllocPitch_v2}, {"cuMemAllocPitch_v2", (void *)cuMemAllocPitch_v2},
  {"cuMemFree", (void *)cuMemFree_v2},          {"cuMemFree_v2", (void *)cuMemFree_v2},
  {"cuMemFreeAsync", (void *)cuMemFreeAsync},   {"cuMemRelease", (void *)cuMemRelease},
};

static void *hooked(const char *name) {
  for (unsigned i = 0; i < sizeof hooks / sizeof *hooks; i++)
    if (!strcmp(name, hooks[i].name)) return hooks[i].fn;
  return NULL;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);

/* The async calls have per-thread-default-stream twins (_ptsz) the runtime may ask for; their signatures are the
 * same, and the stream makes no difference to what is counted, so the same wrappers answer for them. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  static CUresult (*fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
  if (!fn) fn = (CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))real("cuGetProcAddress_v2");
  CUresult r = fn(symbol, pfn, version, flags, status);
  void *ours = hooked(symbol);
  if (r == CUDA_SUCCESS && ours && *pfn) *pfn = ours;
  if (r == CUDA_SUCCESS && !strcmp(symbol, "cuGetProcAddress")) /* the version the caller asked for */
    *pfn = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
  return r;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  static CUresult (*fn)(const char *, void **, int, cuuint64_t);
  if (!fn) fn = (CUresult(*)(const char *, void **, int, cuuint64_t))real("cuGetProcAddress");
  CUresult r = fn(symbol, pfn, version, flags);
  void *ours = hooked(symbol);
  if (r == CUDA_SUCCESS && ours && *pfn) *pfn = ours;
  return r;
}

void *dlsym(void *handle, const char *name) {
  if (!strncmp(name, "cu", 2)) {
    if (!strcmp(name, "cuGetProcAddress_v2")) return (void *)cuGetProcAddress_v2;
    if (!strcmp(name, "cuGetProcAddress")) return (void *)cuGetProcAddress;
    void *ours = hooked(name);
    if (ours) return ours;
  }
  return the_real_dlsym()(handle, name);
}
