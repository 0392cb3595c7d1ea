/* A stand-in libcuda for the CPU tests of aotc/runtime/driver.py: the entry points the runtime calls,
 * answering as the machine the STUB_* environment variables describe, and recording what they were
 * given (read back through ctypes) so a test sees the exact C arguments of each call. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v ? atoi(v) : fallback;
}

int stub_init_calls = 0;
int stub_launches = 0;
uint64_t stub_launch_args[12];      /* f, grid x y z, block x y z, smem, stream, params, extra, attrs|n */
uint64_t stub_first_param = 0;      /* the 8 bytes params[0] points at */
uint64_t stub_memset[4];            /* cuMemsetD32Async: ptr, value, count, stream */
uint64_t stub_tensor_map[16];       /* cuTensorMapEncodeTiled: what it was given */

int cuDriverGetVersion(int *version) { *version = env_int("STUB_CUDA_VERSION", 13000); return 0; }
int cuInit(unsigned flags) { (void)flags; stub_init_calls++; return env_int("STUB_INIT_CODE", 0); }

int cuGetErrorName(int code, const char **name) {
    switch (code) {
    case 0: *name = "CUDA_SUCCESS"; return 0;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 999: *name = "CUDA_ERROR_UNKNOWN"; return 0;
    default: return 1; /* CUDA_ERROR_INVALID_VALUE: a code the driver does not know */
    }
}

int cuDeviceGetCount(int *n) { *n = env_int("STUB_DEVICES", 1); return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return ordinal < env_int("STUB_DEVICES", 1) ? 0 : 101; }
int cuDeviceGetAttribute(int *value, int attribute, int dev) {
    (void)dev;
    *value = attribute == 16 ? 132 : attribute == 75 ? 9 : attribute == 76 ? 0 : -1;
    return *value < 0 ? 1 : 0;
}
int cuDeviceGetName(char *name, int len, int dev) { (void)dev; strncpy(name, "Stub GPU", (size_t)len); return 0; }

int cuMemAlloc(uint64_t *ptr, size_t bytes) { *ptr = 0x7f0000000000ull + bytes; return env_int("STUB_ALLOC_CODE", 0); }
int cuMemsetD8(uint64_t ptr, unsigned char v, size_t n) { (void)ptr; (void)v; (void)n; return 0; }
int cuMemFree(uint64_t ptr) { (void)ptr; return 0; }
int cuMemsetD32Async(uint64_t ptr, unsigned v, size_t n, void *stream) {
    stub_memset[0] = ptr; stub_memset[1] = v; stub_memset[2] = n; stub_memset[3] = (uint64_t)(uintptr_t)stream;
    return 0;
}
int cuStreamSynchronize(void *stream) { (void)stream; return 0; }
uint64_t stub_memcpy[3];            /* cuMemcpyHtoD: dst, bytes, the first 8 bytes copied */
int cuMemcpyHtoD(uint64_t dst, const void *src, size_t n) {
    stub_memcpy[0] = dst; stub_memcpy[1] = n; stub_memcpy[2] = 0;
    memcpy(&stub_memcpy[2], src, n < 8 ? n : 8);
    return 0;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void *stream, void **params, void **extra) {  /* what cuda-bindings calls */
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)stream; (void)extra;
    stub_first_param = params ? *(uint64_t *)params[0] : 0;
    return 0;
}

static void log3(uint64_t op, uint64_t a, uint64_t b);

typedef struct {
    unsigned grid[3], block[3], shared_mem_bytes;
    void *stream;
    void *attrs;
    unsigned num_attrs;
} launch_config;  /* CUlaunchConfig */

int cuLaunchKernelEx(const launch_config *c, void *f, void **params, void **extra) {
    uint64_t a[12] = {(uint64_t)(uintptr_t)f, c->grid[0], c->grid[1], c->grid[2], c->block[0], c->block[1],
                      c->block[2], c->shared_mem_bytes, (uint64_t)(uintptr_t)c->stream,
                      (uint64_t)(uintptr_t)params, (uint64_t)(uintptr_t)extra,
                      (uint64_t)(uintptr_t)c->attrs | c->num_attrs};
    memcpy(stub_launch_args, a, sizeof a);
    stub_first_param = params ? *(uint64_t *)params[0] : 0;
    stub_launches++;
    log3(3, (uint64_t)(uintptr_t)c->stream, 0);
    return env_int("STUB_LAUNCH_CODE", 0);
}

int cuTensorMapEncodeTiled(void *map, int dtype, unsigned rank, void *address, const uint64_t *dims,
                           const uint64_t *strides, const uint32_t *box, const uint32_t *element_strides,
                           int interleave, int swizzle, int l2, int oob) {
    uint64_t *out = (uint64_t *)map;
    if ((uintptr_t)map % 64) return 1;
    stub_tensor_map[0] = (uint64_t)(uintptr_t)address;
    stub_tensor_map[1] = (uint64_t)dtype | (uint64_t)rank << 8 | (uint64_t)swizzle << 16 | (uint64_t)l2 << 24 |
                         (uint64_t)interleave << 32 | (uint64_t)oob << 40;
    for (unsigned i = 0; i < rank && i < 4; i++) {
        stub_tensor_map[2 + i] = dims[i];
        stub_tensor_map[6 + i] = box[i] | (uint64_t)element_strides[i] << 32;
        if (i + 1 < rank) stub_tensor_map[10 + i] = strides[i];
    }
    for (int i = 0; i < 16; i++) out[i] = 0xA0C0000000000000ull + (uint64_t)i;  /* recognisable bytes */
    return 0;
}

/* streams and events: handles count up from these bases; stub_order logs (op, a, b) triples in call order:
   op 1 = cuEventRecord(event a, stream b), 2 = cuStreamWaitEvent(stream a, event b), 3 = a launch on stream a,
   4 = cuEventDestroy_v2(event a) */
uint64_t stub_order[48];
int stub_order_n = 0;
static uint64_t next_stream = 0x5000, next_event = 0xE000;
static void log3(uint64_t op, uint64_t a, uint64_t b) {
    if (stub_order_n + 3 <= 48) { stub_order[stub_order_n] = op; stub_order[stub_order_n + 1] = a;
                                  stub_order[stub_order_n + 2] = b; stub_order_n += 3; }
}
int cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = (void *)(uintptr_t)next_stream++; return 0; }
int cuEventCreate(void **e, unsigned flags) { (void)flags; *e = (void *)(uintptr_t)next_event++; return 0; }
int cuEventRecord(void *e, void *s) { log3(1, (uint64_t)(uintptr_t)e, (uint64_t)(uintptr_t)s); return 0; }
int cuEventDestroy_v2(void *e) { log3(4, (uint64_t)(uintptr_t)e, 0); return 0; }
/* the capture status cuStreamIsCapturing reports for every stream (tests set it) */
int stub_capture_status = 0;
int cuStreamIsCapturing(void *s, int *status) { (void)s; *status = stub_capture_status; return 0; }
int cuStreamWaitEvent(void *s, void *e, unsigned flags) {
    (void)flags; log3(2, (uint64_t)(uintptr_t)s, (uint64_t)(uintptr_t)e); return 0;
}

struct entry { const char *name; void *fn; };
static const struct entry table[] = {
    {"cuDriverGetVersion", (void *)cuDriverGetVersion}, {"cuInit", (void *)cuInit},
    {"cuGetErrorName", (void *)cuGetErrorName}, {"cuDeviceGetCount", (void *)cuDeviceGetCount},
    {"cuDeviceGet", (void *)cuDeviceGet}, {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
    {"cuDeviceGetName", (void *)cuDeviceGetName}, {"cuMemAlloc", (void *)cuMemAlloc},
    {"cuMemsetD8", (void *)cuMemsetD8}, {"cuMemFree", (void *)cuMemFree},
    {"cuMemcpyHtoD", (void *)cuMemcpyHtoD},
    {"cuMemsetD32Async", (void *)cuMemsetD32Async}, {"cuStreamSynchronize", (void *)cuStreamSynchronize},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx}, {"cuLaunchKernel", (void *)cuLaunchKernel}, {"cuTensorMapEncodeTiled", (void *)cuTensorMapEncodeTiled},
    {"cuStreamCreate", (void *)cuStreamCreate}, {"cuEventCreate", (void *)cuEventCreate},
    {"cuEventRecord", (void *)cuEventRecord}, {"cuStreamWaitEvent", (void *)cuStreamWaitEvent},
    {"cuEventDestroy_v2", (void *)cuEventDestroy_v2}, {"cuStreamIsCapturing", (void *)cuStreamIsCapturing},
};

/* CUdriverProcAddressQueryResult: 0 found, 1 symbol not found; CUDA_ERROR_NOT_FOUND is 500 */
int cuGetProcAddress_v2(const char *symbol, void **fn, int version, uint64_t flags, int *status) {
    (void)version; (void)flags;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(symbol, table[i].name)) { *fn = table[i].fn; if (status) *status = 0; return 0; }
    *fn = NULL;
    if (status) *status = 1;
    return 500;
}
