/* A CUDA driver workload with known allocation sites, for tests and the demo.
 *
 * Protocol: prints "ready PID", waits for a line on stdin, runs the scenario,
 * prints "done" and one "expect k=v ..." line with the totals it produced, waits
 * for a line (or EOF) on stdin, and exits. With SIMWORK_NOWAIT=1 it does not
 * wait at all (the demo); SIMWORK_LINGER_MS=N then keeps it N ms before it
 * exits, as any real program lives a little after its last allocation.
 *
 * Scenarios:
 *   kinds          every allocation and free function once, known sizes
 *   threads N SEC [RATE]
 *                  N threads allocating and freeing for SEC seconds, each
 *                  at most RATE allocations per second (default: no limit)
 *   oom BYTES [HELD]
 *                  one allocation of BYTES (over SIMCUDA_CAPACITY: fails),
 *                  after one of HELD bytes kept
 *   hold BYTES     one device allocation kept until exit
 *   grow FIRST SECOND FREED
 *                  one device allocation of FIRST bytes and 4 KiB pinned,
 *                  then prints "first"; after a second line, SECOND bytes
 *                  kept and FREED bytes allocated and freed (one call each):
 *                  a counter scraped between the two steps starts at FIRST
 *                  or at 0, which Prometheus's rate() extrapolates exactly
 *   pairs N        N cuMemAlloc_v2 + cuMemFree_v2 pairs of 4 KiB from one
 *                  thread; expects ns_per_pair (the benchmark's probe cost)
 *   stacks N [FIRST]
 *                  N allocations of 512 bytes held live, each from a
 *                  distinct call stack: paths FIRST to FIRST+N-1 (default
 *                  0) of log2(FIRST+N) calls through two functions, so that
 *                  processes given disjoint ranges share no stack
 *   deep N         one allocation held live, N calls deep (deeper than the
 *                  127 native frames a stack keeps: flagged truncated)
 *   devices        allocations on devices 0, 1 and 2 (SIMCUDA_DEVICES=3) from
 *                  threads switching contexts with every context call
 *   retain         VMM handles released once per reference, as NCCL frees
 *                  them: cuMemRetainAllocationHandle then two cuMemRelease
 *   spike          peaks in two runs (SIMCUDA_DEVICES=2): memory held on
 *                  GPUs 0 and 1, and on GPU 1 a spike from first_spike,
 *                  freed; after a second line, first_spike again and a
 *                  higher spike from higher_spike, freed; each run expects
 *                  its peaks
 *   modules MODULE LIBRARY
 *                  kernel images (the simulated driver's images are text:
 *                  their device bytes) in four runs: a module of MODULE
 *                  bytes loaded (cuModuleLoadData, from load_kernels); a
 *                  library of LIBRARY bytes (cuLibraryLoadData, from
 *                  load_library); the module unloaded; the library
 *                  unloaded
 *   loads BYTES    every module and library load function once, each an
 *                  image of BYTES bytes (from a file for cuModuleLoad and
 *                  cuLibraryLoadFromFile), kept until exit
 *   demo           a small model's weights, activations and a leak; with
 *                  SIMWORK_NOWAIT it then holds its memory for a minute
 *   train          a training loop over 1.4 s (docs/timeline.png): weights
 *                  and optimizer state held, each step's activations kept
 *                  for the backward pass, its gradients' temporaries and the
 *                  optimizer's scratch; step 11's batch is twice as large
 */
#include "../simcuda/cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define CHECK(call)                                                              \
	do {                                                                     \
		CUresult rc_ = (call);                                           \
		if (rc_ != CUDA_SUCCESS) {                                       \
			fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, rc_); \
			exit(1);                                                 \
		}                                                                \
	} while (0)

static int nowait;

static void wait_line(void)
{
	char line[64];
	if (!nowait && !fgets(line, sizeof(line), stdin))
		return;
}

/* ---- kinds ---- */

static CUdeviceptr before_attach;

NOINLINE static void alloc_device(CUdeviceptr out[3])
{
	for (int i = 0; i < 3; i++)
		CHECK(cuMemAlloc_v2(&out[i], 1 << 20));
}

NOINLINE static void alloc_pitched(CUdeviceptr *out)
{
	size_t pitch;
	CHECK(cuMemAllocPitch_v2(out, &pitch, 1000, 30, 4));
	if (pitch != 1024)
		exit(1);
}

NOINLINE static void alloc_managed(CUdeviceptr *out)
{
	CHECK(cuMemAllocManaged(out, 2 << 20, 1));
}

NOINLINE static void alloc_host(void **a, void **b)
{
	CHECK(cuMemAllocHost_v2(a, 4096));
	CHECK(cuMemHostAlloc(b, 8192, 0));
}

NOINLINE static void alloc_async(CUdeviceptr out[4])
{
	CHECK(cuMemAllocAsync(&out[0], 65536, NULL));
	CHECK(cuMemAllocAsync(&out[1], 65536, NULL));
	CHECK(cuMemAllocAsync_ptsz(&out[2], 32768, NULL));
	CHECK(cuMemAllocFromPoolAsync(&out[3], 131072, NULL, NULL));
}

NOINLINE static void alloc_pool_ptsz(CUdeviceptr *out)
{
	CHECK(cuMemAllocFromPoolAsync_ptsz(out, 16384, NULL, NULL));
}

static const CUmemAllocationProp on_device0 = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};

NOINLINE static void alloc_vmm(CUmemGenericAllocationHandle out[2])
{
	CHECK(cuMemCreate(&out[0], 2 << 20, &on_device0, 0));
	CHECK(cuMemCreate(&out[1], 4 << 20, &on_device0, 0));
}

NOINLINE static void free_some(CUdeviceptr dev[3], void *host_b, CUdeviceptr async[4],
			       CUdeviceptr pool_ptsz, CUmemGenericAllocationHandle vmm[2])
{
	CHECK(cuMemFree_v2(dev[1]));
	CHECK(cuMemFreeHost(host_b));
	CHECK(cuMemFreeAsync(async[1], NULL));
	CHECK(cuMemFreeAsync_ptsz(async[2], NULL));
	CHECK(cuMemFreeAsync(pool_ptsz, NULL));
	CHECK(cuMemRelease(vmm[0]));
	/* allocated before the tracer attached: an unknown free */
	CHECK(cuMemFree_v2(before_attach));
	/* a free the driver refuses: not a free */
	if (cuMemFree_v2(0x10) != CUDA_ERROR_INVALID_VALUE)
		exit(1);
	/* a null pointer: nothing freed, not an unknown free */
	(void)cuMemFree_v2(0);
}

static void kinds_setup(void)
{
	CHECK(cuMemAlloc_v2(&before_attach, 12345));
}

static void kinds(void)
{
	CUdeviceptr dev[3], pitched, managed, async[4], pool_ptsz;
	CUmemGenericAllocationHandle vmm[2];
	void *host_a, *host_b;

	alloc_device(dev);
	alloc_pitched(&pitched);
	alloc_managed(&managed);
	alloc_host(&host_a, &host_b);
	alloc_async(async);
	alloc_pool_ptsz(&pool_ptsz);
	alloc_vmm(vmm);
	free_some(dev, host_b, async, pool_ptsz, vmm);
	printf("done\nexpect\n");
}

/* ---- threads ---- */

static CUcontext main_ctx;

struct worker {
	int index;
	double seconds;
	double rate;
	unsigned long long allocs, alloc_bytes, frees, freed_bytes;
};

#define WINDOW 8

NOINLINE static void worker_free(struct worker *w, CUdeviceptr p, size_t size)
{
	CHECK(cuMemFree_v2(p));
	w->frees++;
	w->freed_bytes += size;
}

NOINLINE static void *worker_loop(void *arg)
{
	struct worker *w = arg;
	CUdeviceptr live[WINDOW] = {0};
	size_t sizes[WINDOW] = {0};
	struct timespec start, now;
	CHECK(cuCtxSetCurrent(main_ctx));
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (unsigned long i = 0;; i++) {
		if ((i & 15) == 0) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			double elapsed = now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) / 1e9;
			if (elapsed >= w->seconds)
				break;
			if (w->rate > 0 && i / w->rate > elapsed)
				usleep((useconds_t)((i / w->rate - elapsed) * 1e6));
		}
		int slot = i % WINDOW;
		if (live[slot])
			worker_free(w, live[slot], sizes[slot]);
		sizes[slot] = 4096 * (w->index + 1) + 512 * (i % 7);
		CHECK(cuMemAlloc_v2(&live[slot], sizes[slot]));
		w->allocs++;
		w->alloc_bytes += sizes[slot];
	}
	/* keep the first half of the window live, free the rest */
	for (int slot = WINDOW / 2; slot < WINDOW; slot++)
		if (live[slot])
			worker_free(w, live[slot], sizes[slot]);
	return NULL;
}

static void threads(int n, double seconds, double rate)
{
	pthread_t tids[64];
	struct worker workers[64];
	if (n < 1 || n > 64)
		exit(2);
	for (int i = 0; i < n; i++) {
		workers[i] = (struct worker){.index = i, .seconds = seconds, .rate = rate};
		pthread_create(&tids[i], NULL, worker_loop, &workers[i]);
	}
	unsigned long long allocs = 0, alloc_bytes = 0, frees = 0, freed_bytes = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(tids[i], NULL);
		allocs += workers[i].allocs;
		alloc_bytes += workers[i].alloc_bytes;
		frees += workers[i].frees;
		freed_bytes += workers[i].freed_bytes;
	}
	printf("done\nexpect allocs=%llu alloc_bytes=%llu frees=%llu freed_bytes=%llu\n", allocs,
	       alloc_bytes, frees, freed_bytes);
}

/* ---- oom, hold ---- */

NOINLINE static void allocate_too_much(size_t bytes, size_t held)
{
	CUdeviceptr p;
	if (held)
		CHECK(cuMemAlloc_v2(&p, held));
	CUresult rc = cuMemAlloc_v2(&p, bytes);
	printf("done\nexpect result=%d\n", rc);
}

NOINLINE static void hold(size_t bytes)
{
	CUdeviceptr p;
	CHECK(cuMemAlloc_v2(&p, bytes));
	printf("done\nexpect\n");
}

/* ---- grow ---- */

NOINLINE static void grow(size_t first, size_t second, size_t freed)
{
	CUdeviceptr a, b, c;
	void *pinned;
	CHECK(cuMemAlloc_v2(&a, first));
	CHECK(cuMemAllocHost_v2(&pinned, 4096));
	printf("first\n");
	wait_line();
	CHECK(cuMemAlloc_v2(&b, second));
	CHECK(cuMemAlloc_v2(&c, freed));
	CHECK(cuMemFree_v2(c));
	printf("done\nexpect\n");
}

/* ---- devices: 18 MiB on device 0, 30 MiB on 1, 10 MiB on 2 (plus 19 MiB
 * of VMM memory), and host and managed memory on no device ---- */

#define MiB (1 << 20)

NOINLINE static void alloc_on(size_t bytes)
{
	CUdeviceptr p;
	CHECK(cuMemAlloc_v2(&p, bytes));
}

NOINLINE static void *primary_on_device1(void *arg)
{
	CUcontext ctx;
	(void)arg;
	CHECK(cuDevicePrimaryCtxRetain(&ctx, 1));
	CHECK(cuCtxSetCurrent(ctx));
	alloc_on(1 * MiB);
	alloc_on(1 * MiB);
	return NULL;
}

NOINLINE static void *push_and_pop(void *arg)
{
	CUcontext created, dev0, popped;
	(void)arg;
	CHECK(cuCtxCreate_v2(&created, 0, 2));
	alloc_on(3 * MiB);
	CHECK(cuDevicePrimaryCtxRetain(&dev0, 0));
	CHECK(cuCtxPushCurrent_v2(dev0));
	alloc_on(5 * MiB);
	CHECK(cuCtxPopCurrent_v2(&popped));
	alloc_on(7 * MiB);
	CHECK(cuCtxPopCurrent_v2(&popped));
	CHECK(cuCtxDestroy_v2(created));
	return NULL;
}

NOINLINE static void *created_v3_v4(void *arg)
{
	CUcontext v3, v4, popped;
	(void)arg;
	CHECK(cuCtxCreate_v3(&v3, NULL, 0, 0, 1));
	alloc_on(11 * MiB);
	CHECK(cuCtxCreate_v4(&v4, NULL, 0, 0));
	alloc_on(13 * MiB);
	CHECK(cuCtxPopCurrent_v2(&popped));
	alloc_on(17 * MiB);
	return NULL;
}

static void devices_scenario(void)
{
	void *(*threads_fns[])(void *) = {primary_on_device1, push_and_pop, created_v3_v4};
	pthread_t tids[3];
	for (int i = 0; i < 3; i++) {
		pthread_create(&tids[i], NULL, threads_fns[i], NULL);
		pthread_join(tids[i], NULL); /* one at a time: each its own thread */
	}
	CUmemGenericAllocationHandle h;
	const CUmemAllocationProp on_device2 = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 2}};
	CHECK(cuMemCreate(&h, 19 * MiB, &on_device2, 0));
	const CUmemAllocationProp on_host = {.location = {CU_MEM_LOCATION_TYPE_HOST, 0}};
	CHECK(cuMemCreate(&h, 6 * MiB, &on_host, 0));
	void *host;
	CHECK(cuMemAllocHost_v2(&host, 4096));
	CUdeviceptr managed;
	CHECK(cuMemAllocManaged(&managed, 8192, 1));
	printf("done\nexpect\n");
}

/* ---- benchmarks ---- */

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

NOINLINE static void pairs(long n)
{
	CUdeviceptr p;
	double start = now_ns();
	for (long i = 0; i < n; i++) {
		CHECK(cuMemAlloc_v2(&p, 4096));
		CHECK(cuMemFree_v2(p));
	}
	printf("done\nexpect ns_per_pair=%.0f\n", (now_ns() - start) / n);
}

NOINLINE static void branch_b(unsigned long path, int depth);

/* Two functions calling each other along the bits of path: each path of
 * depth calls is a distinct stack. */
NOINLINE static void branch_a(unsigned long path, int depth)
{
	CUdeviceptr p;
	if (depth == 0) {
		CHECK(cuMemAlloc_v2(&p, 512));
		return;
	}
	if (path & 1)
		branch_b(path >> 1, depth - 1);
	else
		branch_a(path >> 1, depth - 1);
}

NOINLINE static void branch_b(unsigned long path, int depth)
{
	CUdeviceptr p;
	if (depth == 0) {
		CHECK(cuMemAlloc_v2(&p, 512));
		return;
	}
	if (path & 1)
		branch_b(path >> 1, depth - 1);
	else
		branch_a(path >> 1, depth - 1);
}

static void distinct_stacks(long n, long first)
{
	int depth = 0;
	while ((1L << depth) < first + n)
		depth++;
	for (long i = first; i < first + n; i++)
		branch_a((unsigned long)i, depth);
	printf("done\nexpect stacks=%ld depth=%d allocs=%ld alloc_bytes=%ld frees=0 freed_bytes=0\n", n, depth, n, 512 * n);
}

/* ---- deep ---- */

NOINLINE static void call_down(int n)
{
	CUdeviceptr p;
	if (n > 0) {
		call_down(n - 1);
		__asm__ volatile("" ::: "memory"); /* not a tail call: a frame each */
		return;
	}
	CHECK(cuMemAlloc_v2(&p, 4096));
}

/* ---- retain ---- */

NOINLINE static CUmemGenericAllocationHandle create_mapped(size_t bytes, CUdeviceptr at)
{
	CUmemGenericAllocationHandle h;
	CHECK(cuMemCreate(&h, bytes, &on_device0, 0));
	CHECK(cuMemMap(at, bytes, 0, h, 0));
	return h;
}

/* release_retained frees as NCCL's ncclCuMemFree does: a reference from
 * the address, released, then the creation's, unless keep is set. */
NOINLINE static void release_retained(CUdeviceptr at, int keep)
{
	CUmemGenericAllocationHandle h;
	CHECK(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)at));
	CHECK(cuMemRelease(h));
	if (!keep)
		CHECK(cuMemRelease(h));
}

static void retain_scenario(void)
{
	create_mapped(3 << 20, 0x7f0000000000);
	create_mapped(5 << 20, 0x7f1000000000);
	release_retained(0x7f0000000000, 0);
	release_retained(0x7f1000000000, 1);
	printf("done\nexpect created=%d live=%d\n", 8 << 20, 5 << 20);
}

/* ---- spike ---- */

NOINLINE static void spike_base(size_t bytes)
{
	CUdeviceptr p;
	CHECK(cuMemAlloc_v2(&p, bytes)); /* held until exit */
}

/* spike allocates n buffers of bytes each, then frees them all; inlined,
 * so that its caller calls the driver. */
__attribute__((always_inline)) static inline void spike(int n, size_t bytes, CUdeviceptr *buffers)
{
	for (int i = 0; i < n; i++)
		CHECK(cuMemAlloc_v2(&buffers[i], bytes));
	for (int i = 0; i < n; i++)
		CHECK(cuMemFree_v2(buffers[i]));
}

NOINLINE static void first_spike(void)
{
	CUdeviceptr buffers[3];
	spike(3, 5 * MiB, buffers);
}

NOINLINE static void higher_spike(void)
{
	CUdeviceptr buffers[2];
	spike(2, 12 * MiB, buffers);
}

/* set_device makes device the calling thread's, in a context call the
 * tracer sees (main's came before it attached). */
static void set_device(int device)
{
	CUcontext ctx;
	CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
	CHECK(cuCtxSetCurrent(ctx));
}

static void spike_scenario(void)
{
	set_device(0);
	spike_base(8 * MiB);
	set_device(1);
	spike_base(2 * MiB);
	first_spike();
	printf("done\nexpect gpu0_base=%d gpu1_base=%d first_spike=%d gpu1_peak=%d\n", 8 * MiB, 2 * MiB,
	       15 * MiB, 17 * MiB);
	wait_line();
	first_spike();
	higher_spike();
	printf("done\nexpect gpu0_base=%d gpu1_base=%d higher_spike=%d gpu1_peak=%d\n", 8 * MiB, 2 * MiB,
	       24 * MiB, 26 * MiB);
}

/* ---- modules ---- */

NOINLINE static CUmodule load_kernels(const char *image)
{
	CUmodule m;
	CHECK(cuModuleLoadData(&m, image));
	return m;
}

NOINLINE static CUlibrary load_library(const char *image)
{
	CUlibrary l;
	CHECK(cuLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0));
	return l;
}

static void modules_scenario(const char *module_bytes, const char *library_bytes)
{
	CUmodule m = load_kernels(module_bytes);
	printf("done\nexpect module=%s\n", module_bytes);
	wait_line();
	CUlibrary l = load_library(library_bytes);
	printf("done\nexpect library=%s\n", library_bytes);
	wait_line();
	CHECK(cuModuleUnload(m));
	printf("done\nexpect\n");
	wait_line();
	CHECK(cuLibraryUnload(l));
	printf("done\nexpect\n");
}

static void loads_scenario(const char *bytes)
{
	char path[] = "/tmp/simwork-image-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0 || write(fd, bytes, strlen(bytes)) != (ssize_t)strlen(bytes) || close(fd))
		exit(1);
	CUmodule m[4];
	CUlibrary l[2];
	CHECK(cuModuleLoad(&m[0], path));
	CHECK(cuModuleLoadData(&m[1], bytes));
	CHECK(cuModuleLoadDataEx(&m[2], bytes, 0, NULL, NULL));
	CHECK(cuModuleLoadFatBinary(&m[3], bytes));
	CHECK(cuLibraryLoadData(&l[0], bytes, NULL, NULL, 0, NULL, NULL, 0));
	CHECK(cuLibraryLoadFromFile(&l[1], path, NULL, NULL, 0, NULL, NULL, 0));
	unlink(path);
	printf("done\nexpect loads=6\n");
}

/* ---- demo ---- */

NOINLINE static void load_weights(CUdeviceptr *layers, int n)
{
	for (int i = 0; i < n; i++)
		CHECK(cuMemAlloc_v2(&layers[i], 64 << 20));
}

NOINLINE static void allocate_kv_cache(CUdeviceptr *cache)
{
	CHECK(cuMemAlloc_v2(cache, 512 << 20));
}

NOINLINE static CUdeviceptr forward_activation(size_t bytes)
{
	CUdeviceptr p;
	CHECK(cuMemAllocAsync(&p, bytes, NULL));
	return p;
}

NOINLINE static void forward(int step, CUdeviceptr *leaked)
{
	CUdeviceptr a = forward_activation(16 << 20);
	CUdeviceptr b = forward_activation(8 << 20);
	CHECK(cuMemFreeAsync(a, NULL));
	if (step % 4 == 0)
		*leaked = b; /* kept by mistake: the leak the profile shows */
	else
		CHECK(cuMemFreeAsync(b, NULL));
}

NOINLINE static void pin_staging_buffer(void **p)
{
	CHECK(cuMemAllocHost_v2(p, 32 << 20));
}

static void demo(void)
{
	CUdeviceptr layers[12], cache, leaked[16];
	void *staging;
	load_weights(layers, 12);
	allocate_kv_cache(&cache);
	pin_staging_buffer(&staging);
	for (int step = 0; step < 64; step++) {
		forward(step, &leaked[step / 4]);
		usleep(20000);
	}
	printf("done\nexpect\n");
	/* hold the memory, as a server would, until stopped */
	if (nowait)
		sleep(60);
}

/* ---- train ---- */

NOINLINE static void load_model(CUdeviceptr *weights, int n)
{
	for (int i = 0; i < n; i++)
		CHECK(cuMemAlloc_v2(&weights[i], 64 * MiB));
}

NOINLINE static void init_optimizer(CUdeviceptr *state)
{
	CHECK(cuMemAlloc_v2(state, 256 * MiB)); /* Adam's moments */
}

/* layer_forward keeps its activation for the backward pass. */
NOINLINE static CUdeviceptr layer_forward(size_t bytes)
{
	CUdeviceptr p;
	CHECK(cuMemAllocAsync(&p, bytes, NULL));
	return p;
}

NOINLINE static void layer_backward(CUdeviceptr activation, size_t bytes)
{
	CUdeviceptr grad;
	CHECK(cuMemAllocAsync(&grad, bytes / 2, NULL));
	CHECK(cuMemFreeAsync(activation, NULL));
	CHECK(cuMemFreeAsync(grad, NULL));
}

NOINLINE static void optimizer_step(void)
{
	CUdeviceptr scratch;
	CHECK(cuMemAlloc_v2(&scratch, 128 * MiB));
	usleep(5000);
	CHECK(cuMemFree_v2(scratch));
}

static void train(void)
{
	CUdeviceptr weights[8], state, activations[12];
	load_model(weights, 8);
	init_optimizer(&state);
	for (int step = 0; step < 16; step++) {
		size_t batch = (step == 11 ? 48 : 24) * MiB;
		for (int l = 0; l < 12; l++) {
			activations[l] = layer_forward(batch);
			usleep(3000);
		}
		for (int l = 11; l >= 0; l--) {
			layer_backward(activations[l], batch);
			usleep(2000);
		}
		optimizer_step();
		usleep(20000);
	}
	printf("done\nexpect\n");
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	nowait = getenv("SIMWORK_NOWAIT") != NULL;
	if (argc < 2) {
		fprintf(stderr, "usage: simwork kinds|threads N SEC [RATE]|oom BYTES [HELD]|hold BYTES|grow FIRST SECOND FREED|pairs N|stacks N [FIRST]|deep N|devices|retain|spike|modules MODULE LIBRARY|loads BYTES|demo|train\n");
		return 2;
	}
	CHECK(cuInit(0));
	CHECK(cuDevicePrimaryCtxRetain(&main_ctx, 0));
	CHECK(cuCtxSetCurrent(main_ctx));
	const char *scenario = argv[1];
	if (!strcmp(scenario, "kinds"))
		kinds_setup();

	printf("ready %d\n", getpid());
	wait_line();
	if (!strcmp(scenario, "kinds"))
		kinds();
	else if (!strcmp(scenario, "threads") && (argc == 4 || argc == 5))
		threads(atoi(argv[2]), atof(argv[3]), argc == 5 ? atof(argv[4]) : 0);
	else if (!strcmp(scenario, "oom") && (argc == 3 || argc == 4))
		allocate_too_much(strtoull(argv[2], NULL, 0), argc == 4 ? strtoull(argv[3], NULL, 0) : 0);
	else if (!strcmp(scenario, "hold") && argc == 3)
		hold(strtoull(argv[2], NULL, 0));
	else if (!strcmp(scenario, "grow") && argc == 5)
		grow(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
	else if (!strcmp(scenario, "pairs") && argc == 3)
		pairs(atol(argv[2]));
	else if (!strcmp(scenario, "stacks") && (argc == 3 || argc == 4))
		distinct_stacks(atol(argv[2]), argc == 4 ? atol(argv[3]) : 0);
	else if (!strcmp(scenario, "deep") && argc == 3) {
		call_down(atoi(argv[2]));
		printf("done\nexpect\n");
	}
	else if (!strcmp(scenario, "devices"))
		devices_scenario();
	else if (!strcmp(scenario, "retain"))
		retain_scenario();
	else if (!strcmp(scenario, "spike"))
		spike_scenario();
	else if (!strcmp(scenario, "modules") && argc == 4)
		modules_scenario(argv[2], argv[3]);
	else if (!strcmp(scenario, "loads") && argc == 3)
		loads_scenario(argv[2]);
	else if (!strcmp(scenario, "demo"))
		demo();
	else if (!strcmp(scenario, "train"))
		train();
	else {
		fprintf(stderr, "simwork: unknown scenario %s\n", scenario);
		return 2;
	}
	wait_line();
	const char *linger = getenv("SIMWORK_LINGER_MS");
	if (linger)
		usleep(atoi(linger) * 1000);
	return 0;
}
