// A simulated PyTorch CUDA caching allocator, built as libc10_cuda.so, for
// tests: the same USDT probes as torch's libc10_cuda.so (pytorch:malloc and
// pytorch:free, gated by semaphores in .probes), allocator functions under
// the same C++ names, and the same way of growing: device memory comes from
// the (simulated) driver in segments, carved into blocks that are cached
// when freed. Blocks are reused, so a tensor's pointer is often a segment's.
//
// C API, for ctypes (tests/workloads/simwork.py):
//   int  simtorch_malloc(int device, size_t size, void **ptr)  0, or 2 when out of memory
//   void simtorch_free(void *ptr)         a storage's deleter (pytorch:free)
//   void *simtorch_raw_alloc(size_t size) torch.cuda.caching_allocator_alloc: no USDT site
//   void *simtorch_raw_alloc_with_stream(size_t size, void *stream)  the same, on a stream
//   void simtorch_raw_delete(void *ptr)   torch.cuda.caching_allocator_delete: no USDT site
//   void simtorch_empty_cache(void)  returns cached segments to the driver
//   size_t simtorch_memory_reserved(int device)   bytes of segments, as torch.cuda.memory_reserved()
//   size_t simtorch_memory_allocated(int device)  bytes of live blocks, as torch.cuda.memory_allocated()
//   size_t simtorch_memory_requested(int device)  bytes live tensors asked for, as memory_stats()'s
//                                                 requested_bytes.all.current: the tensor view
//   size_t simtorch_max_memory_reserved(int device)   the most of each since the start or the
//   size_t simtorch_max_memory_allocated(int device)  last reset, as torch.cuda.max_memory_reserved(),
//   size_t simtorch_max_memory_requested(int device)  max_memory_allocated() and requested_bytes.all.peak
//   void simtorch_reset_peak_memory_stats(int device) as torch.cuda.reset_peak_memory_stats()
//   size_t simtorch_inactive_bytes(int device, size_t *largest)  the free blocks inside the default
//       pool's segments, as memory_snapshot()'s inactive blocks: their sum, and the largest
//   void simtorch_set_memory_fraction(int device, double fraction)  as
//       torch.cuda.set_per_process_memory_fraction: segments beyond that share of the
//       device's memory are refused without asking the driver
//
// Out of memory, the allocator calls c10::reportOutOfMemoryToProfiler in
// libc10.so (c10.cc), as torch's does, before it fails.
//
// CUDA graphs' private pools, as torch's allocator keeps them (see
// docs/pytorch-allocator-books.md): blocks allocated while a capture is
// under way come from the capture's pool; a pool's checkpoint is restored
// by the allocator's own functions, without the USDT sites, through
// NativeCachingAllocator::setCheckpointPoolState with torch's signature and
// torch's layouts of CheckpointDelta and PrivatePoolState, so that
// gpu-mem's probes on it read this library as they read torch's:
//   uint64_t simtorch_graph_pool_handle(void)   a new pool's id, as torch.cuda.graph_pool_handle()
//   void simtorch_begin_allocate_to_pool(int device, uint64_t pool)  capture begins
//   void simtorch_end_allocate_to_pool(int device, uint64_t pool)    capture ends
//   void simtorch_release_pool(int device, uint64_t pool)  the graph is gone: the pool's
//                                                          free segments go at the next empty_cache
//       (through NativeCachingAllocator::beginAllocateToPool, endAllocateToPool and
//       releasePool, with torch's signatures: gpu-mem's probes on the first two name
//       the segments a capture makes as its graph's pool)
//   size_t simtorch_pool_reserved(int device, uint64_t pool)   bytes of the pool's segments, as
//                                                              memory_snapshot()'s segments of its pool id
//   size_t simtorch_pool_requested(int device, uint64_t pool)  what the live tensors in them asked for
//   void *simtorch_get_checkpoint_state(int device, uint64_t pool)  torch._C._cuda_getCheckpointState
//   void simtorch_free_checkpoint_state(void *state)
//   size_t simtorch_set_checkpoint_pool_state(int device, void *state, void **freed, size_t *nfreed,
//                                             void **created, size_t max)
//       torch._C._cuda_setCheckpointPoolState: the blocks it freed (*nfreed of them) and
//       re-created (returned), max at most each; the caller frees the re-created ones
//       with simtorch_free (their deleter) or, for tensors dead meanwhile, simtorch_raw_delete,
//       and never the freed ones
#define _SDT_HAS_SEMAPHORES 1
#include <pthread.h>
#include <sys/sdt.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "../simcuda/cuda.h"

// libc10.so's (c10.cc), as torch's libc10_cuda.so calls it.
namespace c10 {
struct Device {
	int8_t type;
	int8_t index;
};
void reportOutOfMemoryToProfiler(int64_t alloc_size, size_t total_allocated, size_t total_reserved, Device device);
} // namespace c10

constexpr int8_t kCUDA = 1; // c10::DeviceType::CUDA

extern "C" {
// The kernel counts attached probes here; the probes cost nothing without.
unsigned short pytorch_malloc_semaphore __attribute__((section(".probes"))) __attribute__((used));
unsigned short pytorch_free_semaphore __attribute__((section(".probes"))) __attribute__((used));
}

namespace c10 {
using DeviceIndex = int8_t;

namespace cuda {
namespace CUDACachingAllocator {

// A private pool's id, as torch's MempoolId_t: {0, n} from graph_pool_handle.
using MempoolId_t = std::pair<unsigned long long, unsigned long long>; // torch's CaptureId_t pair: the same mangled names

// The checkpoint of a private pool, laid out as torch's: gpu-mem reads
// PrivatePoolState::segments, SegmentState::blocks and BlockState's size,
// ptr and allocated (gadgets/include/gpumem.h, GPUMEM_CKPT_*).
struct AllocatorState {
	virtual ~AllocatorState() = default;
};

// stream_set takes the room of torch's ska::flat_hash_set<CUDAStream>.
struct stream_set {
	void *entries = nullptr;
	uint64_t num_slots_minus_one = 0;
	int8_t hash_shift = 63, max_lookups = 3;
	float max_load_factor = 0.5f;
	uint64_t num_elements = 0;
};

struct BlockState {
	DeviceIndex device = 0;
	void *stream = nullptr;
	stream_set stream_uses;
	size_t size = 0;
	void *ptr = nullptr;
	bool allocated = false;
	int64_t gc_count_base = 0;
};

struct SegmentState {
	std::vector<BlockState> blocks;
	bool is_small = false;
};

struct PrivatePoolState : AllocatorState {
	MempoolId_t owner_id = {0, 0};
	std::vector<SegmentState> segments;
};

static_assert(sizeof(BlockState) == 80 && offsetof(BlockState, size) == 48 && offsetof(BlockState, ptr) == 56 &&
		      offsetof(BlockState, allocated) == 64,
	      "BlockState as torch's");
static_assert(sizeof(SegmentState) == 32, "SegmentState as torch's");

// DataPtr takes the room of at::DataPtr: the data pointer first.
struct DataPtr {
	void *data;
	void (*deleter)(void *);
	void *context;
	DeviceIndex type, index;
};

// CheckpointDelta is what a restore returns, as torch's: the pointers it
// freed, then the blocks it made live again.
struct CheckpointDelta {
	std::vector<void *> ptrs_freed;
	std::vector<DataPtr> dataptrs_allocd;
};

namespace Native {

constexpr size_t kMinBlock = 512;          // every size is rounded up to this
constexpr size_t kSmallSize = 1 << 20;     // largest "small" request
constexpr size_t kSmallBuffer = 2 << 20;   // segment of the small pool
constexpr size_t kLargeBuffer = 20 << 20;  // segment for large requests under kMinLargeAlloc
constexpr size_t kMinLargeAlloc = 10 << 20;
constexpr size_t kRoundLarge = 2 << 20;
constexpr MempoolId_t kDefaultPool = {0, 0};

struct Block {
	CUdeviceptr ptr;
	size_t size;
	CUdeviceptr segment;  // the segment's base pointer
	bool allocated;
	bool small;
	size_t requested;     // what the tensor asked for, while allocated
	MempoolId_t pool;     // kDefaultPool, or a CUDA graph's private pool
};

// Stats are the allocator's own account, as torch's memory_stats() keeps
// it: the tests compare gpu-mem's views with it.
struct Stats {
	size_t reserved;   // segments from the driver
	size_t allocated;  // blocks given to tensors, rounded
	size_t requested;  // what those tensors asked for
	// The most of each since the start or the last reset.
	size_t peak_reserved, peak_allocated, peak_requested;

	void note_peaks()
	{
		peak_reserved = std::max(peak_reserved, reserved);
		peak_allocated = std::max(peak_allocated, allocated);
		peak_requested = std::max(peak_requested, requested);
	}

	void reset_peaks()
	{
		peak_reserved = reserved;
		peak_allocated = allocated;
		peak_requested = requested;
	}
};

// PrivatePool counts the graphs that use a pool: at zero its free
// segments go back to the driver at the next empty_cache.
struct PrivatePool {
	int use_count = 1;
};

struct RestoreResult {
	std::vector<void *> allocations_freed;
	std::vector<Block *> allocations_created;
};

class DeviceCachingAllocator {
public:
	explicit DeviceCachingAllocator(int device) : device_(device) {}

	// malloc returns a block of at least size bytes, or nullptr when the
	// driver is out of memory even with the cache emptied, or the memory
	// fraction is reached: reported first, as torch's malloc reports it.
	__attribute__((noinline)) Block *malloc(size_t size)
	{
		std::lock_guard<std::mutex> lock(mu_);
		size_t requested = size;
		MempoolId_t pool = captures_underway_.empty() ? kDefaultPool : captures_underway_.back();
		size = round_size(size);
		Block *b = find_free(size, pool);
		if (!b)
			b = grow(size, pool);
		if (!b) {
			c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), stats_.allocated, stats_.reserved,
							 c10::Device{kCUDA, static_cast<int8_t>(device_)});
			return nullptr;
		}
		alloc_found_block(b, size, requested);
		return b;
	}

	// set_fraction caps the segments at fraction of the device's memory,
	// as torch's setMemoryFraction.
	void set_fraction(double fraction)
	{
		std::lock_guard<std::mutex> lock(mu_);
		size_t free, total;
		cuMemGetInfo_v2(&free, &total);
		allowed_ = static_cast<size_t>(fraction * static_cast<double>(total));
	}

	__attribute__((noinline)) void free(Block *b)
	{
		std::lock_guard<std::mutex> lock(mu_);
		free_block(b);
	}

	Block *block(CUdeviceptr ptr)
	{
		std::lock_guard<std::mutex> lock(mu_);
		auto it = blocks_.find(ptr);
		return it == blocks_.end() || !it->second.allocated ? nullptr : &it->second;
	}

	Stats stats()
	{
		std::lock_guard<std::mutex> lock(mu_);
		return stats_;
	}

	void reset_peak_stats()
	{
		std::lock_guard<std::mutex> lock(mu_);
		stats_.reset_peaks();
	}

	// empty_cache frees every segment no tensor uses, of the default pool
	// and of the pools no graph uses any more.
	void empty_cache()
	{
		std::lock_guard<std::mutex> lock(mu_);
		release_free_segments();
	}

	void begin_allocate_to_pool(MempoolId_t id)
	{
		std::lock_guard<std::mutex> lock(mu_);
		auto [it, fresh] = graph_pools_.emplace(id, PrivatePool{});
		if (!fresh)
			it->second.use_count++;
		captures_underway_.push_back(id);
	}

	void end_allocate_to_pool(MempoolId_t id)
	{
		std::lock_guard<std::mutex> lock(mu_);
		captures_underway_.erase(std::find(captures_underway_.begin(), captures_underway_.end(), id));
	}

	void release_pool(MempoolId_t id)
	{
		std::lock_guard<std::mutex> lock(mu_);
		graph_pools_.at(id).use_count--;
	}

	// inactive sums the default pool's free blocks and finds the largest.
	size_t inactive(size_t *largest)
	{
		std::lock_guard<std::mutex> lock(mu_);
		size_t sum = 0;
		*largest = 0;
		for (auto &[ptr, b] : blocks_) {
			if (b.pool == kDefaultPool && !b.allocated) {
				sum += b.size;
				*largest = std::max(*largest, b.size);
			}
		}
		return sum;
	}

	// pool_bytes sums the pool's blocks: all (its segments, reserved) or the
	// live tensors' requests.
	size_t pool_bytes(MempoolId_t id, bool requested)
	{
		std::lock_guard<std::mutex> lock(mu_);
		size_t sum = 0;
		for (auto &[ptr, b] : blocks_)
			if (b.pool == id)
				sum += requested ? (b.allocated ? b.requested : 0) : b.size;
		return sum;
	}

	// getCheckpointState records every segment of the pool, block by block.
	std::shared_ptr<AllocatorState> getCheckpointState(MempoolId_t id)
	{
		std::lock_guard<std::mutex> lock(mu_);
		auto state = std::make_shared<PrivatePoolState>();
		state->owner_id = id;
		for (auto &[ptr, b] : blocks_) {
			if (b.pool != id)
				continue;
			if (b.ptr == b.segment)
				state->segments.push_back(SegmentState{{}, b.small});
			BlockState bs;
			bs.device = (DeviceIndex)device_;
			bs.size = b.size;
			bs.ptr = reinterpret_cast<void *>(b.ptr);
			bs.allocated = b.allocated;
			state->segments.back().blocks.push_back(bs);
		}
		return state;
	}

	// setCheckpointPoolState does what torch's does: it frees every block
	// allocated in the pool, then, segment by segment, allocates every
	// block of the checkpoint with its block size as its request and frees
	// those not live in it; none of it passes the USDT sites.
	__attribute__((noinline)) RestoreResult setCheckpointPoolState(PrivatePoolState &pps)
	{
		std::lock_guard<std::mutex> lock(mu_);
		RestoreResult rr;
		for (auto &[ptr, b] : blocks_) {
			if (b.pool == pps.owner_id && b.allocated)
				rr.allocations_freed.push_back(reinterpret_cast<void *>(ptr));
		}
		for (void *ptr : rr.allocations_freed)
			free_block(&blocks_.at(reinterpret_cast<CUdeviceptr>(ptr)));
		for (const SegmentState &segment : pps.segments)
			set_segment_state(segment, rr);
		return rr;
	}

private:
	static size_t round_size(size_t size)
	{
		return size < kMinBlock ? kMinBlock : (size + kMinBlock - 1) / kMinBlock * kMinBlock;
	}

	static size_t segment_size(size_t size)
	{
		if (size <= kSmallSize)
			return kSmallBuffer;
		if (size < kMinLargeAlloc)
			return kLargeBuffer;
		return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
	}

	// alloc_found_block hands out the first size bytes of free block b, as
	// a tensor that asked for requested bytes.
	void alloc_found_block(Block *b, size_t size, size_t requested)
	{
		split(b, size);
		b->allocated = true;
		b->requested = requested;
		stats_.allocated += b->size;
		stats_.requested += requested;
		stats_.note_peaks();
	}

	void free_block(Block *b)
	{
		b->allocated = false;
		stats_.allocated -= b->size;
		stats_.requested -= b->requested;
		merge(b);
	}

	// set_segment_state lays one segment out as its checkpoint says; the
	// segment's blocks are all free (merged into one) when it starts.
	void set_segment_state(const SegmentState &segment, RestoreResult &rr)
	{
		for (const BlockState &bs : segment.blocks)
			alloc_found_block(&blocks_.at(reinterpret_cast<CUdeviceptr>(bs.ptr)), bs.size, bs.size);
		for (const BlockState &bs : segment.blocks) {
			Block *b = &blocks_.at(reinterpret_cast<CUdeviceptr>(bs.ptr));
			if (bs.allocated)
				rr.allocations_created.push_back(b);
			else
				free_block(b);
		}
	}

	Block *find_free(size_t size, MempoolId_t pool)
	{
		Block *best = nullptr;
		bool small = size <= kSmallSize;
		for (auto &[ptr, b] : blocks_)
			if (!b.allocated && b.pool == pool && b.small == small && b.size >= size &&
			    (!best || b.size < best->size))
				best = &b;
		return best;
	}

	Block *grow(size_t size, MempoolId_t pool)
	{
		size_t bytes = segment_size(size);
		if (stats_.reserved + bytes > allowed_)
			return nullptr; // the fraction's limit: the driver is not asked
		CUdeviceptr ptr;
		if (cuMemAlloc_v2(&ptr, bytes) != CUDA_SUCCESS) {
			release_free_segments();
			if (cuMemAlloc_v2(&ptr, bytes) != CUDA_SUCCESS)
				return nullptr;
		}
		stats_.reserved += bytes;
		stats_.note_peaks();
		auto [it, ok] = blocks_.emplace(ptr, Block{ptr, bytes, ptr, false, size <= kSmallSize, 0, pool});
		return &it->second;
	}

	void split(Block *b, size_t size)
	{
		if (b->size == size)
			return;
		CUdeviceptr rest = b->ptr + size;
		blocks_.emplace(rest, Block{rest, b->size - size, b->segment, false, b->small, 0, b->pool});
		b->size = size;
	}

	// merge joins a freed block with its free neighbours in its segment.
	void merge(Block *b)
	{
		auto it = blocks_.find(b->ptr);
		auto next = std::next(it);
		if (next != blocks_.end() && !next->second.allocated && next->second.segment == b->segment) {
			b->size += next->second.size;
			blocks_.erase(next);
		}
		if (it != blocks_.begin()) {
			auto prev = std::prev(it);
			if (!prev->second.allocated && prev->second.segment == b->segment) {
				prev->second.size += b->size;
				blocks_.erase(it);
			}
		}
	}

	// releasable: the default pool's segments and those of pools no graph
	// uses; a pool left with no segment is forgotten.
	bool releasable(MempoolId_t pool) const
	{
		return pool == kDefaultPool || graph_pools_.at(pool).use_count == 0;
	}

	void release_free_segments()
	{
		for (auto it = blocks_.begin(); it != blocks_.end();) {
			Block &b = it->second;
			if (!b.allocated && b.ptr == b.segment && releasable(b.pool) &&
			    (std::next(it) == blocks_.end() || std::next(it)->second.segment != b.segment)) {
				cuMemFree_v2(b.ptr);
				stats_.reserved -= b.size;
				it = blocks_.erase(it);
			} else {
				++it;
			}
		}
		for (auto it = graph_pools_.begin(); it != graph_pools_.end();) {
			bool used = it->second.use_count > 0 ||
				    std::any_of(blocks_.begin(), blocks_.end(), [&](auto &kv) { return kv.second.pool == it->first; });
			it = used ? std::next(it) : graph_pools_.erase(it);
		}
	}

	int device_;
	size_t allowed_ = SIZE_MAX; // set_fraction's
	std::mutex mu_;
	std::map<CUdeviceptr, Block> blocks_;
	std::map<MempoolId_t, PrivatePool> graph_pools_;
	std::vector<MempoolId_t> captures_underway_;
	Stats stats_{};
};

void local_raw_delete(void *ptr);

class NativeCachingAllocator {
public:
	DeviceCachingAllocator &device(int d)
	{
		std::lock_guard<std::mutex> lock(mu_);
		auto it = devices_.find(d);
		if (it == devices_.end())
			it = devices_.emplace(d, new DeviceCachingAllocator(d)).first;
		return *it->second;
	}

	// allocate gives a tensor its storage, as torch's allocate(size): the
	// pytorch:malloc site is here.
	__attribute__((noinline)) void *allocate(int d, size_t size)
	{
		use_device(d);
		Block *b = device(d).malloc(size);
		if (!b)
			return nullptr;
		if (pytorch_malloc_semaphore)
			STAP_PROBE4(pytorch, malloc, b->ptr, (int8_t)d, size, nullptr);
		return reinterpret_cast<void *>(b->ptr);
	}

	// set_fraction caps device d's segments, in its context, as torch's
	// set_per_process_memory_fraction initializes the device first.
	void set_fraction(int d, double fraction)
	{
		use_device(d);
		device(d).set_fraction(fraction);
	}

	// raw_alloc and raw_alloc_with_stream hand out a block on the current
	// device without the pytorch:malloc site, as torch's
	// (torch.cuda.caching_allocator_alloc).
	__attribute__((noinline)) void *raw_alloc(size_t nbytes) { return malloc_current(nbytes); }

	__attribute__((noinline)) void *raw_alloc_with_stream(size_t nbytes, void *stream)
	{
		(void)stream;
		return malloc_current(nbytes);
	}

	__attribute__((noinline)) void free(void *ptr)
	{
		std::lock_guard<std::mutex> lock(mu_);
		for (auto &[d, a] : devices_) {
			if (Block *b = a->block(reinterpret_cast<CUdeviceptr>(ptr))) {
				a->free(b);
				return;
			}
		}
	}

	// raw_delete frees ptr without the pytorch:free site, as torch's
	// (torch.cuda.caching_allocator_delete; CUDA graph trees free the dead
	// tensors' blocks a restore made live again with it).
	__attribute__((noinline)) void raw_delete(void *ptr) { free(ptr); }

	void empty_cache()
	{
		std::lock_guard<std::mutex> lock(mu_);
		for (auto &[d, a] : devices_)
			a->empty_cache();
	}

	// beginAllocateToPool, endAllocateToPool and releasePool have torch's
	// signatures (the filter says which streams' allocations go to the
	// pool: here all of them): gpu-mem finds the first two by name and
	// names the segments allocated between them as the pool's.
	__attribute__((noinline)) void beginAllocateToPool(DeviceIndex d, MempoolId_t id, std::function<bool(CUstream)> filter)
	{
		(void)filter;
		device(d).begin_allocate_to_pool(id);
	}

	__attribute__((noinline)) void endAllocateToPool(DeviceIndex d, MempoolId_t id) { device(d).end_allocate_to_pool(id); }

	__attribute__((noinline)) void releasePool(DeviceIndex d, MempoolId_t id) { device(d).release_pool(id); }

	// setCheckpointPoolState has torch's signature: gpu-mem finds it by
	// name and reads its arguments and result as torch's.
	__attribute__((noinline)) CheckpointDelta setCheckpointPoolState(DeviceIndex d, std::shared_ptr<AllocatorState> as)
	{
		auto pps = std::dynamic_pointer_cast<PrivatePoolState>(as);
		RestoreResult rr = device(d).setCheckpointPoolState(*pps);
		CheckpointDelta cpd;
		cpd.ptrs_freed = rr.allocations_freed;
		for (Block *b : rr.allocations_created)
			cpd.dataptrs_allocd.push_back(DataPtr{reinterpret_cast<void *>(b->ptr), &local_raw_delete, nullptr, 1, d});
		return cpd;
	}

private:
	// use_device makes the device's primary context current on this thread,
	// as PyTorch's device guard does.
	static void use_device(int d)
	{
		if (current == d)
			return;
		CUcontext ctx;
		cuDevicePrimaryCtxRetain(&ctx, d);
		cuCtxSetCurrent(ctx);
		current = d;
	}

	// malloc_current allocates on the thread's current device, as torch's
	// raw_alloc does.
	void *malloc_current(size_t nbytes)
	{
		int d = current < 0 ? 0 : current;
		use_device(d);
		Block *b = device(d).malloc(nbytes);
		return b ? reinterpret_cast<void *>(b->ptr) : nullptr;
	}

	static thread_local int current;

	std::mutex mu_;
	std::map<int, DeviceCachingAllocator *> devices_;
};

thread_local int NativeCachingAllocator::current = -1;

NativeCachingAllocator allocator;

// local_raw_delete is a storage's deleter, as torch's: the pytorch:free
// site is here.
__attribute__((noinline)) void local_raw_delete(void *ptr)
{
	if (pytorch_free_semaphore)
		STAP_PROBE1(pytorch, free, ptr);
	allocator.free(ptr);
}

} // namespace Native
} // namespace CUDACachingAllocator
} // namespace cuda
} // namespace c10

using c10::cuda::CUDACachingAllocator::AllocatorState;
using c10::cuda::CUDACachingAllocator::CheckpointDelta;
using c10::cuda::CUDACachingAllocator::MempoolId_t;
using c10::cuda::CUDACachingAllocator::Native::allocator;
using c10::cuda::CUDACachingAllocator::Native::local_raw_delete;

// A tensor allocated on a thread of its own (simtorch_malloc_on_thread).
struct ThreadMalloc {
	const char *name;
	int device;
	size_t size;
	void *ptr;
};

static void *malloc_on_thread(void *arg)
{
	auto *m = static_cast<ThreadMalloc *>(arg);
	pthread_setname_np(pthread_self(), m->name); // before it allocates
	m->ptr = allocator.allocate(m->device, m->size);
	return nullptr;
}

extern "C" {
int simtorch_malloc(int device, size_t size, void **ptr)
{
	*ptr = allocator.allocate(device, size);
	return *ptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

// simtorch_malloc_on_thread allocates on a new thread named name, without
// Python frames, as PyTorch's autograd threads (pt_autograd_0) allocate a
// backward pass's tensors, gradients included.
int simtorch_malloc_on_thread(const char *name, int device, size_t size, void **ptr)
{
	ThreadMalloc m{name, device, size, nullptr};
	pthread_t t;
	if (pthread_create(&t, nullptr, malloc_on_thread, &m) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_join(t, nullptr);
	*ptr = m.ptr;
	return *ptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

void simtorch_free(void *ptr) { local_raw_delete(ptr); }

void *simtorch_raw_alloc(size_t nbytes) { return allocator.raw_alloc(nbytes); }

void *simtorch_raw_alloc_with_stream(size_t nbytes, void *stream) { return allocator.raw_alloc_with_stream(nbytes, stream); }

void simtorch_raw_delete(void *ptr) { allocator.raw_delete(ptr); }

void simtorch_empty_cache(void) { allocator.empty_cache(); }

size_t simtorch_memory_reserved(int device) { return allocator.device(device).stats().reserved; }
size_t simtorch_memory_allocated(int device) { return allocator.device(device).stats().allocated; }
size_t simtorch_memory_requested(int device) { return allocator.device(device).stats().requested; }
size_t simtorch_max_memory_reserved(int device) { return allocator.device(device).stats().peak_reserved; }
size_t simtorch_max_memory_allocated(int device) { return allocator.device(device).stats().peak_allocated; }
size_t simtorch_max_memory_requested(int device) { return allocator.device(device).stats().peak_requested; }
void simtorch_reset_peak_memory_stats(int device) { allocator.device(device).reset_peak_stats(); }
size_t simtorch_inactive_bytes(int device, size_t *largest) { return allocator.device(device).inactive(largest); }
void simtorch_set_memory_fraction(int device, double fraction) { allocator.set_fraction(device, fraction); }

uint64_t simtorch_graph_pool_handle(void)
{
	static std::atomic<uint64_t> next{1};
	return next++;
}

void simtorch_begin_allocate_to_pool(int device, uint64_t pool)
{
	allocator.beginAllocateToPool((int8_t)device, {0, pool}, [](CUstream) { return true; });
}
void simtorch_end_allocate_to_pool(int device, uint64_t pool) { allocator.endAllocateToPool((int8_t)device, {0, pool}); }
void simtorch_release_pool(int device, uint64_t pool) { allocator.releasePool((int8_t)device, {0, pool}); }
size_t simtorch_pool_reserved(int device, uint64_t pool) { return allocator.device(device).pool_bytes({0, pool}, false); }
size_t simtorch_pool_requested(int device, uint64_t pool) { return allocator.device(device).pool_bytes({0, pool}, true); }

void *simtorch_get_checkpoint_state(int device, uint64_t pool)
{
	return new std::shared_ptr<AllocatorState>(allocator.device(device).getCheckpointState({0, pool}));
}

void simtorch_free_checkpoint_state(void *state) { delete static_cast<std::shared_ptr<AllocatorState> *>(state); }

size_t simtorch_set_checkpoint_pool_state(int device, void *state, void **freed, size_t *nfreed, void **created, size_t max)
{
	CheckpointDelta d = allocator.setCheckpointPoolState((int8_t)device, *static_cast<std::shared_ptr<AllocatorState> *>(state));
	*nfreed = std::min(max, d.ptrs_freed.size());
	std::copy_n(d.ptrs_freed.begin(), *nfreed, freed);
	size_t n = std::min(max, d.dataptrs_allocd.size());
	for (size_t i = 0; i < n; i++)
		created[i] = d.dataptrs_allocd[i].data;
	return n;
}
}
