// A simulated PyTorch CUDA caching allocator, built as libc10_cuda.so, for
// tests: the same USDT probes as torch's libc10_cuda.so (pytorch:malloc and
// pytorch:free, gated by semaphores in .probes), allocator functions under
// the same C++ names, and the same way of growing: device memory comes from
// the (simulated) driver in segments, carved into blocks that are cached
// when freed. Blocks are reused, so a tensor's pointer is often a segment's.
//
// C API, for ctypes (tests/workloads/simwork.py):
//   int  simtorch_malloc(int device, size_t size, void **ptr)  0, or 2 when out of memory
//   void simtorch_free(void *ptr)
//   void simtorch_empty_cache(void)  returns cached segments to the driver
//   size_t simtorch_memory_reserved(int device)   bytes of segments, as torch.cuda.memory_reserved()
//   size_t simtorch_memory_allocated(int device)  bytes of live blocks, as torch.cuda.memory_allocated()
//   size_t simtorch_memory_requested(int device)  bytes live tensors asked for, as memory_stats()'s
//                                                 requested_bytes.all.current: the tensor view
//   size_t simtorch_max_memory_reserved(int device)   the most of each since the start or the
//   size_t simtorch_max_memory_allocated(int device)  last reset, as torch.cuda.max_memory_reserved(),
//   size_t simtorch_max_memory_requested(int device)  max_memory_allocated() and requested_bytes.all.peak
//   void simtorch_reset_peak_memory_stats(int device) as torch.cuda.reset_peak_memory_stats()
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

#include "../simcuda/cuda.h"

extern "C" {
// The kernel counts attached probes here; the probes cost nothing without.
unsigned short pytorch_malloc_semaphore __attribute__((section(".probes"))) __attribute__((used));
unsigned short pytorch_free_semaphore __attribute__((section(".probes"))) __attribute__((used));
}

namespace c10 {
namespace cuda {
namespace CUDACachingAllocator {
namespace Native {

constexpr size_t kMinBlock = 512;          // every size is rounded up to this
constexpr size_t kSmallSize = 1 << 20;     // largest "small" request
constexpr size_t kSmallBuffer = 2 << 20;   // segment of the small pool
constexpr size_t kLargeBuffer = 20 << 20;  // segment for large requests under kMinLargeAlloc
constexpr size_t kMinLargeAlloc = 10 << 20;
constexpr size_t kRoundLarge = 2 << 20;

struct Block {
	CUdeviceptr ptr;
	size_t size;
	CUdeviceptr segment;  // the segment's base pointer
	bool allocated;
	bool small;
	size_t requested;     // what the tensor asked for, while allocated
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

class DeviceCachingAllocator {
public:
	explicit DeviceCachingAllocator(int device) : device_(device) {}

	// malloc returns a block of at least size bytes, or nullptr when the
	// driver is out of memory even with the cache emptied.
	__attribute__((noinline)) Block *malloc(int device, size_t size, void *stream)
	{
		std::lock_guard<std::mutex> lock(mu_);
		size_t requested = size; // what the probe reports, as in torch
		size = round_size(size);
		Block *b = find_free(size);
		if (!b)
			b = grow(size);
		if (!b)
			return nullptr;
		split(b, size);
		b->allocated = true;
		b->requested = requested;
		stats_.allocated += b->size;
		stats_.requested += requested;
		stats_.note_peaks();
		if (pytorch_malloc_semaphore)
			STAP_PROBE4(pytorch, malloc, b->ptr, (int8_t)device, requested, stream);
		return b;
	}

	__attribute__((noinline)) void free(Block *b)
	{
		std::lock_guard<std::mutex> lock(mu_);
		if (pytorch_free_semaphore)
			STAP_PROBE1(pytorch, free, b->ptr);
		b->allocated = false;
		stats_.allocated -= b->size;
		stats_.requested -= b->requested;
		merge(b);
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

	// empty_cache frees every segment no tensor uses.
	void empty_cache()
	{
		std::lock_guard<std::mutex> lock(mu_);
		release_free_segments();
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

	Block *find_free(size_t size)
	{
		Block *best = nullptr;
		bool small = size <= kSmallSize;
		for (auto &[ptr, b] : blocks_)
			if (!b.allocated && b.small == small && b.size >= size && (!best || b.size < best->size))
				best = &b;
		return best;
	}

	Block *grow(size_t size)
	{
		size_t bytes = segment_size(size);
		CUdeviceptr ptr;
		if (cuMemAlloc_v2(&ptr, bytes) != CUDA_SUCCESS) {
			release_free_segments();
			if (cuMemAlloc_v2(&ptr, bytes) != CUDA_SUCCESS)
				return nullptr;
		}
		stats_.reserved += bytes;
		stats_.note_peaks();
		auto [it, ok] = blocks_.emplace(ptr, Block{ptr, bytes, ptr, false, size <= kSmallSize, 0});
		return &it->second;
	}

	void split(Block *b, size_t size)
	{
		if (b->size == size)
			return;
		CUdeviceptr rest = b->ptr + size;
		blocks_.emplace(rest, Block{rest, b->size - size, b->segment, false, b->small, 0});
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

	void release_free_segments()
	{
		for (auto it = blocks_.begin(); it != blocks_.end();) {
			Block &b = it->second;
			if (!b.allocated && b.ptr == b.segment &&
			    (std::next(it) == blocks_.end() || std::next(it)->second.segment != b.segment)) {
				cuMemFree_v2(b.ptr);
				stats_.reserved -= b.size;
				it = blocks_.erase(it);
			} else {
				++it;
			}
		}
	}

	int device_;
	std::mutex mu_;
	std::map<CUdeviceptr, Block> blocks_;
	Stats stats_{};
};

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

	__attribute__((noinline)) void *raw_alloc(int d, size_t size)
	{
		use_device(d);
		Block *b = device(d).malloc(d, size, nullptr);
		return b ? reinterpret_cast<void *>(b->ptr) : nullptr;
	}

	__attribute__((noinline)) void raw_delete(void *ptr)
	{
		std::lock_guard<std::mutex> lock(mu_);
		for (auto &[d, a] : devices_) {
			if (Block *b = a->block(reinterpret_cast<CUdeviceptr>(ptr))) {
				a->free(b);
				return;
			}
		}
	}

	void empty_cache()
	{
		std::lock_guard<std::mutex> lock(mu_);
		for (auto &[d, a] : devices_)
			a->empty_cache();
	}

private:
	// use_device makes the device's primary context current on this thread,
	// as PyTorch's device guard does.
	static void use_device(int d)
	{
		static thread_local int current = -1;
		if (current == d)
			return;
		CUcontext ctx;
		cuDevicePrimaryCtxRetain(&ctx, d);
		cuCtxSetCurrent(ctx);
		current = d;
	}

	std::mutex mu_;
	std::map<int, DeviceCachingAllocator *> devices_;
};

NativeCachingAllocator allocator;

} // namespace Native
} // namespace CUDACachingAllocator
} // namespace cuda
} // namespace c10

using c10::cuda::CUDACachingAllocator::Native::allocator;

extern "C" {
int simtorch_malloc(int device, size_t size, void **ptr)
{
	*ptr = allocator.raw_alloc(device, size);
	return *ptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

void simtorch_free(void *ptr) { allocator.raw_delete(ptr); }

void simtorch_empty_cache(void) { allocator.empty_cache(); }

size_t simtorch_memory_reserved(int device) { return allocator.device(device).stats().reserved; }
size_t simtorch_memory_allocated(int device) { return allocator.device(device).stats().allocated; }
size_t simtorch_memory_requested(int device) { return allocator.device(device).stats().requested; }
size_t simtorch_max_memory_reserved(int device) { return allocator.device(device).stats().peak_reserved; }
size_t simtorch_max_memory_allocated(int device) { return allocator.device(device).stats().peak_allocated; }
size_t simtorch_max_memory_requested(int device) { return allocator.device(device).stats().peak_requested; }
void simtorch_reset_peak_memory_stats(int device) { allocator.device(device).reset_peak_stats(); }
}
