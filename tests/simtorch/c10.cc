// SPDX-License-Identifier: Apache-2.0
// The simulated PyTorch's libc10.so: the one function of torch's that
// gpu-mem probes there, with its real name and signature.

#include <cstddef>
#include <cstdint>

namespace c10 {

// Device is torch's c10::Device: a device type and an index, one byte each,
// passed in one register.
struct Device {
	int8_t type;
	int8_t index;
};

// reportOutOfMemoryToProfiler is what PyTorch's CUDA caching allocator
// calls before it raises out of memory, whether the driver refused it or a
// limit of its own (set_per_process_memory_fraction) did.
__attribute__((noinline, visibility("default"))) void
reportOutOfMemoryToProfiler(int64_t alloc_size, size_t total_allocated, size_t total_reserved, Device device)
{
	asm volatile("" ::"r"(alloc_size), "r"(total_allocated), "r"(total_reserved), "r"(device.index) : "memory");
}

} // namespace c10
