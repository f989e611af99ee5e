/* A simulated CUDA driver: libcuda.so.1 for machines without a GPU.
 *
 * It exports the driver symbols gpu-mem probes, with the real signatures, and
 * behaves like the driver where the tracer can see it: device pointers come
 * from a deterministic address range and are reused after a free, frees of
 * unknown pointers fail with CUDA_ERROR_INVALID_VALUE, and device memory is
 * limited to SIMCUDA_CAPACITY bytes (default 80 GiB) per device, beyond which
 * allocations fail with CUDA_ERROR_OUT_OF_MEMORY. There are SIMCUDA_DEVICES
 * devices (default 1), with primary and created contexts and a per-thread
 * context stack: device allocations land on the device of the calling
 * thread's current context, and fail with CUDA_ERROR_INVALID_CONTEXT
 * without one. Host allocations return real memory so
 * that callers may write to it. An allocation of exactly SIMCUDA_HANG_BYTES
 * never returns, so that tests can kill a thread inside the driver.
 *
 * With SIMNVML_DIR set, it publishes what NVML would say the process uses on
 * each device to SIMNVML_DIR/PID, which the simulated libnvidia-ml.so.1
 * (tests/simnvml) reads: SIMCUDA_CONTEXT_BYTES (default 518 MiB, an H200's
 * bare context) for each context made (the primary one at its first
 * retain), plus the device memory its allocations hold, rounded up as
 * allocated (managed memory and VMM memory on the host count nowhere),
 * plus the kernel images of the modules and libraries loaded and not
 * unloaded. Loading is eager: a load puts its images on the device of the
 * calling thread's current context (a module load fails without one; a
 * library's goes nowhere then). A simulated image (the data a load is
 * given, or the file it names) is text: the device bytes of its kernel
 * images, in decimal, so that a test chooses what NVML grows by.
 * Contexts, images and that file are not limited by SIMCUDA_CAPACITY.
 */
#include "cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEVICE_BASE 0x7e0000000000ULL
#define DEVICE_SPAN (1ULL << 36) /* address range of each device */
#define MAX_DEVICES 16
#define MAX_CTX_STACK 8
#define HANDLE_BASE 0x1000ULL
#define ALIGNMENT 512ULL
#define BUCKETS 65536
#define DEFAULT_CAPACITY (80ULL << 30)
#define DEFAULT_CONTEXT_BYTES (518ULL << 20)

enum space { SPACE_DEVICE, SPACE_HOST, SPACE_HANDLE };

struct block {
	uint64_t addr;
	size_t size;   /* bytes reserved, rounded up to ALIGNMENT */
	enum space space;
	int device;
	uint64_t mapped; /* a handle's address, once cuMemMap mapped it */
	unsigned refs;   /* a handle's references beyond its creation's */
	int resident;    /* held on its device's memory, as NVML counts it */
	struct block *next;
};

struct CUctx_st {
	int device;
	int primary;
};

/* A module or library loaded: where its kernel images are, and their
 * bytes; -1: on no device. */
struct image {
	int device;
	size_t bytes;
};

struct CUmod_st {
	struct image image;
};

struct CUlib_st {
	struct image image;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct block *live[BUCKETS];
static struct block *reusable; /* freed device ranges, most recent first */
static uint64_t device_top[MAX_DEVICES];
static uint64_t next_handle = HANDLE_BASE;
static size_t device_used[MAX_DEVICES];
static size_t nvml_used[MAX_DEVICES]; /* what NVML says the process uses */
static int nvml_listed[MAX_DEVICES];  /* a context was made on the device */
static size_t capacity;
static int devices;
static struct CUctx_st primary[MAX_DEVICES];
static __thread CUcontext ctx_stack[MAX_CTX_STACK];
static __thread int ctx_depth;

static int device_count(void)
{
	if (!devices) {
		const char *env = getenv("SIMCUDA_DEVICES");
		devices = env ? atoi(env) : 1;
		if (devices < 1 || devices > MAX_DEVICES)
			devices = 1;
	}
	return devices;
}

static CUcontext current(void)
{
	return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

static size_t device_capacity(void)
{
	if (!capacity) {
		const char *env = getenv("SIMCUDA_CAPACITY");
		capacity = env ? strtoull(env, NULL, 0) : DEFAULT_CAPACITY;
	}
	return capacity;
}

/* publish writes what NVML says the process uses on each device to
 * SIMNVML_DIR/PID, atomically (a rename), for the simulated NVML of other
 * processes; the lock is held. */
static void publish(void)
{
	const char *dir = getenv("SIMNVML_DIR");
	if (!dir || !*dir)
		return;
	char path[4096], tmp[4096 + 8];
	snprintf(path, sizeof(path), "%s/%d", dir, (int)getpid());
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	for (int d = 0; d < device_count(); d++)
		if (nvml_listed[d])
			fprintf(f, "%d %zu\n", d, nvml_used[d]);
	if (fclose(f) == 0)
		rename(tmp, path);
}

/* charge_nvml adds bytes (or takes them away) on device in NVML's view;
 * the lock is held. */
static void charge_nvml(int device, long long bytes)
{
	nvml_listed[device] = 1;
	nvml_used[device] += bytes;
	publish();
}

/* charge_context adds a context's bytes on device, or with sign -1 takes
 * them away. */
static void charge_context(int device, int sign)
{
	static size_t bytes;
	if (!bytes) {
		const char *env = getenv("SIMCUDA_CONTEXT_BYTES");
		bytes = env ? strtoull(env, NULL, 0) : DEFAULT_CONTEXT_BYTES;
	}
	pthread_mutex_lock(&lock);
	charge_nvml(device, sign * (long long)bytes);
	pthread_mutex_unlock(&lock);
}

static unsigned bucket(uint64_t addr)
{
	return (unsigned)((addr >> 9) ^ (addr >> 25)) % BUCKETS;
}

static void insert(struct block *b)
{
	unsigned i = bucket(b->addr);
	b->next = live[i];
	live[i] = b;
}

static struct block *unlink_block(uint64_t addr, enum space space)
{
	for (struct block **p = &live[bucket(addr)]; *p; p = &(*p)->next) {
		if ((*p)->addr == addr && (*p)->space == space) {
			struct block *b = *p;
			*p = b->next;
			return b;
		}
	}
	return NULL;
}

/* take_device_range reuses the most recently freed range of the same size
 * on the device, as real allocators do, so that tests see addresses come
 * back. */
static uint64_t take_device_range(size_t size, int device)
{
	for (struct block **p = &reusable; *p; p = &(*p)->next) {
		if ((*p)->size == size && (*p)->device == device) {
			struct block *b = *p;
			uint64_t addr = b->addr;
			*p = b->next;
			free(b);
			return addr;
		}
	}
	if (!device_top[device])
		device_top[device] = DEVICE_BASE + device * DEVICE_SPAN;
	uint64_t addr = device_top[device];
	device_top[device] += size;
	return addr;
}

static void hang_if_asked(size_t bytes)
{
	const char *env = getenv("SIMCUDA_HANG_BYTES");
	if (env && strtoull(env, NULL, 0) == bytes)
		for (;;)
			pause();
}

/* reserve_device allocates on device, or on the current context's device
 * when device is negative; resident says whether NVML counts it there. */
static CUresult reserve_device(unsigned long long *out, size_t bytes, enum space space, int device,
			       int resident)
{
	hang_if_asked(bytes);
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	if (bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (device < 0) {
		if (!current())
			return CUDA_ERROR_INVALID_CONTEXT;
		device = current()->device;
	}
	if (device >= device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	size_t size = (bytes + ALIGNMENT - 1) & ~(ALIGNMENT - 1);
	struct block *b = malloc(sizeof(*b));
	if (!b)
		return CUDA_ERROR_OUT_OF_MEMORY;

	pthread_mutex_lock(&lock);
	if (device_used[device] + size > device_capacity()) {
		pthread_mutex_unlock(&lock);
		free(b);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	device_used[device] += size;
	b->size = size;
	b->space = space;
	b->device = device;
	b->mapped = 0;
	b->refs = 0;
	b->resident = resident;
	b->addr = space == SPACE_HANDLE ? next_handle++ : take_device_range(size, device);
	insert(b);
	if (resident)
		charge_nvml(device, size);
	pthread_mutex_unlock(&lock);
	*out = b->addr;
	return CUDA_SUCCESS;
}

static CUresult release_device(uint64_t addr, enum space space)
{
	pthread_mutex_lock(&lock);
	struct block *b = unlink_block(addr, space);
	if (!b) {
		pthread_mutex_unlock(&lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	device_used[b->device] -= b->size;
	if (b->resident)
		charge_nvml(b->device, -(long long)b->size);
	if (space == SPACE_DEVICE) {
		b->next = reusable;
		reusable = b;
	} else {
		free(b);
	}
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

static CUresult reserve_host(void **pp, size_t bytes)
{
	if (!pp || bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct block *b = malloc(sizeof(*b));
	void *mem = calloc(1, bytes);
	if (!b || !mem) {
		free(b);
		free(mem);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	b->addr = (uint64_t)(uintptr_t)mem;
	b->size = bytes;
	b->space = SPACE_HOST;
	pthread_mutex_lock(&lock);
	insert(b);
	pthread_mutex_unlock(&lock);
	*pp = mem;
	return CUDA_SUCCESS;
}

static CUresult release_host(void *p)
{
	pthread_mutex_lock(&lock);
	struct block *b = unlink_block((uint64_t)(uintptr_t)p, SPACE_HOST);
	pthread_mutex_unlock(&lock);
	if (!b)
		return CUDA_ERROR_INVALID_VALUE;
	free(b);
	free(p);
	return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int flags)
{
	return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDriverGetVersion(int *version)
{
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	*version = 13000;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = device_count();
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	if (!primary[dev].primary)
		charge_context(dev, 1);
	primary[dev] = (struct CUctx_st){.device = dev, .primary = 1};
	*pctx = &primary[dev];
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	return dev >= 0 && dev < device_count() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
	if (!ctx) {
		ctx_depth = 0;
		return CUDA_SUCCESS;
	}
	if (!ctx_depth)
		ctx_depth = 1;
	ctx_stack[ctx_depth - 1] = ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = current();
	return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	if (!ctx || ctx_depth == MAX_CTX_STACK)
		return CUDA_ERROR_INVALID_VALUE;
	ctx_stack[ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	if (!ctx_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUcontext ctx = ctx_stack[--ctx_depth];
	if (pctx)
		*pctx = ctx;
	return CUDA_SUCCESS;
}

/* create_context makes a context on dev and pushes it, as the driver does. */
static CUresult create_context(CUcontext *pctx, CUdevice dev)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	struct CUctx_st *ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx->device = dev;
	CUresult rc = cuCtxPushCurrent_v2(ctx);
	if (rc != CUDA_SUCCESS) {
		free(ctx);
		return rc;
	}
	charge_context(dev, 1);
	*pctx = ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	(void)flags;
	return create_context(pctx, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
			unsigned int flags, CUdevice dev)
{
	(void)paramsArray;
	(void)numParams;
	(void)flags;
	return create_context(pctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
			CUdevice dev)
{
	(void)ctxCreateParams;
	(void)flags;
	return create_context(pctx, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	if (!ctx || ctx->primary)
		return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < ctx_depth; i++)
		if (ctx_stack[i] == ctx)
			ctx_stack[i] = NULL;
	charge_context(ctx->device, -1);
	free(ctx);
	return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	*total = device_capacity();
	*free_bytes = *total - device_used[current()->device];
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	return reserve_device(dptr, bytesize, SPACE_DEVICE, -1, 1);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
			    size_t Height, unsigned int ElementSizeBytes)
{
	if (!pPitch || WidthInBytes == 0 || Height == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
		return CUDA_ERROR_INVALID_VALUE;
	size_t pitch = (WidthInBytes + ALIGNMENT - 1) & ~(ALIGNMENT - 1);
	CUresult rc = reserve_device(dptr, pitch * Height, SPACE_DEVICE, -1, 1);
	if (rc == CUDA_SUCCESS)
		*pPitch = pitch;
	return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	(void)flags;
	return reserve_device(dptr, bytesize, SPACE_DEVICE, -1, 0);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	return reserve_host(pp, bytesize);
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	(void)Flags;
	return reserve_host(pp, bytesize);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	(void)hStream;
	return reserve_device(dptr, bytesize, SPACE_DEVICE, -1, 1);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	(void)hStream;
	return reserve_device(dptr, bytesize, SPACE_DEVICE, -1, 1);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				 CUstream hStream)
{
	(void)pool;
	(void)hStream;
	return reserve_device(dptr, bytesize, SPACE_DEVICE, -1, 1);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				      CUstream hStream)
{
	(void)pool;
	(void)hStream;
	return reserve_device(dptr, bytesize, SPACE_DEVICE, -1, 1);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	if (flags != 0 || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	switch (prop->location.type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		return reserve_device(handle, size, SPACE_HANDLE, prop->location.id, 1);
	case CU_MEM_LOCATION_TYPE_HOST: /* counted on device 0's capacity */
		return reserve_device(handle, size, SPACE_HANDLE, 0, 0);
	}
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return release_device(dptr, SPACE_DEVICE);
}

CUresult cuMemFreeHost(void *p)
{
	return release_host(p);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	(void)hStream;
	return release_device(dptr, SPACE_DEVICE);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	(void)hStream;
	return release_device(dptr, SPACE_DEVICE);
}

/* find_handle is the handle's block, or with handle 0 the handle mapped at
 * address; the lock is held. */
static struct block *find_handle(uint64_t handle, uint64_t address)
{
	if (handle) {
		for (struct block *b = live[bucket(handle)]; b; b = b->next)
			if (b->space == SPACE_HANDLE && b->addr == handle)
				return b;
		return NULL;
	}
	for (size_t i = 0; i < BUCKETS; i++)
		for (struct block *b = live[i]; b; b = b->next)
			if (b->space == SPACE_HANDLE && b->mapped == address)
				return b;
	return NULL;
}

/* A handle lives until cuMemRelease has been called once for its creation
 * and once for each cuMemRetainAllocationHandle. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	pthread_mutex_lock(&lock);
	struct block *b = find_handle(handle, 0);
	if (b && b->refs > 0) {
		b->refs--;
		pthread_mutex_unlock(&lock);
		return CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return release_device(handle, SPACE_HANDLE);
}

/* The simulation maps nothing: it remembers where the handle is mapped. */
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		  unsigned long long flags)
{
	(void)size;
	(void)offset;
	(void)flags;
	pthread_mutex_lock(&lock);
	struct block *b = find_handle(handle, 0);
	if (b)
		b->mapped = ptr;
	pthread_mutex_unlock(&lock);
	return b ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	pthread_mutex_lock(&lock);
	struct block *b = find_handle(0, (uint64_t)(uintptr_t)addr);
	if (b) {
		b->refs++;
		*handle = b->addr;
	}
	pthread_mutex_unlock(&lock);
	return b ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- modules and libraries ---- */

/* load_image puts a simulated image of text (its device bytes, in decimal)
 * on device, or on no device when device is negative. */
static CUresult load_image(struct image *out, const void *image, int device)
{
	if (!image)
		return CUDA_ERROR_INVALID_VALUE;
	char *end;
	unsigned long long bytes = strtoull(image, &end, 10);
	if (end == image)
		return CUDA_ERROR_INVALID_IMAGE;
	*out = (struct image){.device = device, .bytes = bytes};
	if (device >= 0) {
		pthread_mutex_lock(&lock);
		charge_nvml(device, (long long)bytes);
		pthread_mutex_unlock(&lock);
	}
	return CUDA_SUCCESS;
}

/* read_image reads a simulated image from a file into buf. */
static CUresult read_image(const char *path, char *buf, size_t size)
{
	if (!path)
		return CUDA_ERROR_INVALID_VALUE;
	FILE *f = fopen(path, "r");
	if (!f)
		return CUDA_ERROR_FILE_NOT_FOUND;
	size_t n = fread(buf, 1, size - 1, f);
	fclose(f);
	buf[n] = 0;
	return CUDA_SUCCESS;
}

static void unload_image(struct image *image)
{
	if (image->device < 0)
		return;
	pthread_mutex_lock(&lock);
	charge_nvml(image->device, -(long long)image->bytes);
	pthread_mutex_unlock(&lock);
}

/* load_module loads a module into the current context. */
static CUresult load_module(CUmodule *module, const void *image)
{
	if (!module)
		return CUDA_ERROR_INVALID_VALUE;
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	struct CUmod_st *m = calloc(1, sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = load_image(&m->image, image, current()->device);
	if (rc != CUDA_SUCCESS) {
		free(m);
		return rc;
	}
	*module = m;
	return CUDA_SUCCESS;
}

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
	char image[64];
	CUresult rc = read_image(fname, image, sizeof(image));
	return rc == CUDA_SUCCESS ? load_module(module, image) : rc;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	return load_module(module, image);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
			    CUjit_option *options, void **optionValues)
{
	(void)numOptions;
	(void)options;
	(void)optionValues;
	return load_module(module, image);
}

CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
	return load_module(module, fatCubin);
}

CUresult cuModuleUnload(CUmodule hmod)
{
	if (!hmod)
		return CUDA_ERROR_INVALID_HANDLE;
	unload_image(&hmod->image);
	free(hmod);
	return CUDA_SUCCESS;
}

/* load_library loads a library, context-independent: eagerly into the
 * current context, as the driver does into every context there is. The
 * simulated images take no JIT or library options. */
static CUresult load_library(CUlibrary *library, const void *code, CUjit_option *jitOptions,
			     void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
			     void **libraryOptionValues, unsigned int numLibraryOptions)
{
	(void)jitOptions;
	(void)jitOptionsValues;
	(void)numJitOptions;
	(void)libraryOptions;
	(void)libraryOptionValues;
	(void)numLibraryOptions;
	if (!library)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUlib_st *l = calloc(1, sizeof(*l));
	if (!l)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = load_image(&l->image, code, current() ? current()->device : -1);
	if (rc != CUDA_SUCCESS) {
		free(l);
		return rc;
	}
	*library = l;
	return CUDA_SUCCESS;
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
			   void **jitOptionsValues, unsigned int numJitOptions,
			   CUlibraryOption *libraryOptions, void **libraryOptionValues,
			   unsigned int numLibraryOptions)
{
	return load_library(library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
			    libraryOptionValues, numLibraryOptions);
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
			       void **jitOptionsValues, unsigned int numJitOptions,
			       CUlibraryOption *libraryOptions, void **libraryOptionValues,
			       unsigned int numLibraryOptions)
{
	char image[64];
	CUresult rc = read_image(fileName, image, sizeof(image));
	return rc == CUDA_SUCCESS ? load_library(library, image, jitOptions, jitOptionsValues, numJitOptions,
						 libraryOptions, libraryOptionValues, numLibraryOptions)
				  : rc;
}

CUresult cuLibraryUnload(CUlibrary library)
{
	if (!library)
		return CUDA_ERROR_INVALID_HANDLE;
	unload_image(&library->image);
	free(library);
	return CUDA_SUCCESS;
}
