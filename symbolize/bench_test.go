package symbolize

import (
	"debug/elf"
	"slices"
	"testing"
)

// benchStack is a stack of 32 frames through libtorch (return addresses
// in the middle of functions spread over the library), in a fake process
// mapping it at base: what the agent names through a large C++ library.
func benchStack(b *testing.B) (root string, addrs []uint64, syms []eagerSymbol) {
	requireFile(b, libtorch)
	syms = readEager(b, libtorch)
	root = b.TempDir()
	fakeProcess(b, root, 100, map[string]uint64{libtorch: base}, map[string][]elf.ProgHeader{libtorch: execSegments(b, libtorch)})
	const frames = 32
	for k := range frames {
		sym := syms[k*len(syms)/frames]
		addrs = append(addrs, base+sym.value+sym.size/2+1)
	}
	return root, addrs, syms
}

// BenchmarkFirstStack is what naming the first stack through libtorch
// costs a fresh Symbolizer (map the file, index its function symbols,
// demangle the names hit), against the eager way it replaced: every
// symbol read and demangled first. bench's symbols section measures the
// same through several libraries, with the heap each keeps.
func BenchmarkFirstStack(b *testing.B) {
	root, addrs, syms := benchStack(b)
	want := make([]string, len(addrs))
	for i, addr := range addrs {
		want[i], _ = eagerLookup(syms, addr-1-base)
	}
	b.Run("lazy", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s := New(root)
			frames := s.Frames(100, addrs)
			s.Forget(100)
			if len(frames) != len(want) {
				b.Fatalf("%d frames for %d addresses", len(frames), len(want))
			}
			for i, f := range frames {
				if f.Function != want[i] {
					b.Fatalf("frame %d: %q, want %q", i, f.Function, want[i])
				}
			}
		}
	})
	b.Run("eager", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			table := readEager(b, libtorch)
			names := make([]string, len(addrs))
			for i, addr := range addrs {
				names[i], _ = eagerLookup(table, addr-1-base)
			}
			if !slices.Equal(names, want) {
				b.Fatalf("names %q, want %q", names, want)
			}
		}
	})
}

// BenchmarkNamedStack is the cost of naming a stack through a library
// whose index is built: every stack after the first.
func BenchmarkNamedStack(b *testing.B) {
	root, addrs, _ := benchStack(b)
	s := New(root)
	s.Frames(100, addrs)
	b.ReportAllocs()
	for b.Loop() {
		if frames := s.Frames(100, addrs); len(frames) != len(addrs) {
			b.Fatalf("%d frames for %d addresses", len(frames), len(addrs))
		}
	}
}
