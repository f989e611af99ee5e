package tracer

import (
	"path/filepath"
	"testing"
)

// TestAllocatorFunctions: the allocator's own functions are found by their
// mangled names' prefixes, whatever their parameters, in the simulated
// allocator (torch's names and signatures); a library without them (the
// simulated driver) has none, which AttachAllocator reports as missing.
func TestAllocatorFunctions(t *testing.T) {
	root := buildSim(t)
	found, err := allocatorFunctions(filepath.Join(root, "build/sim/libc10_cuda.so"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		restoreFunction:        "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator22setCheckpointPoolStateEaSt10shared_ptrINS1_14AllocatorStateEE",
		rawAllocFunction:       "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator9raw_allocEm",
		rawAllocStreamFunction: "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator21raw_alloc_with_streamEmPv",
		rawDeleteFunction:      "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator10raw_deleteEPv",
		poolBeginFunction:      "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator19beginAllocateToPoolEaSt4pairIyyESt8functionIFbP11CUstream_stEE",
		poolEndFunction:        "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator17endAllocateToPoolEaSt4pairIyyE",
	}
	// Only the functions whose results are read need their returns.
	entryOnly := map[string]bool{rawDeleteFunction: true, poolBeginFunction: true, poolEndFunction: true}
	for name, symbol := range want {
		if fn := found[name]; fn.symbol != symbol || !entryOnly[name] && len(fn.returns) == 0 {
			t.Errorf("%s: %+v, want %q and its returns", name, fn, symbol)
		}
	}
	if none, err := allocatorFunctions(filepath.Join(root, "build/sim/libcuda.so.1")); err != nil || len(none) != 0 {
		t.Errorf("in the driver: %v (%v)", none, err)
	}
}
