//go:build fuzzseed

// The seed corpora of symbolize's fuzz targets (testdata/fuzz), written by
// go generate -tags fuzzseed (make fuzz-seeds), not by go test.

package symbolize

//go:generate go test -tags fuzzseed -run ^TestWriteSeeds$ -count=1 .

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
)

func TestWriteSeeds(t *testing.T) {
	t.Run("seeds", writeSeeds)
	t.Run("regressions", writeRegressions)
}

// The seeds: a C++ library built here (its own headers and tables, and
// cut short), its tables in synthesized files, and names a library can
// carry: markup, control characters, invalid UTF-8, mangled names that
// nest or refer back to earlier parts.
var hostileNames = []string{
	"</script><script>alert(1)</script>",
	"a;b\nc\rd\x1b[31m\x00",
	"\xff\xfe\xc0\x80",
	"_ZN5model6Runner17allocate_kv_cacheEi",
	"_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator6mallocEimP11CUstream_st",
	"_Z1fI1AIiES0_IS1_S1_ES0_IS2_S2_EEv",
	"_RNvCs1234_7mycrate3foo",
	"_Z" + strings.Repeat("N1a", 64) + "E" + "v",
}

// writeSeeds writes FuzzParseELF's and FuzzSymbolTable's seeds.
func writeSeeds(t *testing.T) {
	dir := t.TempDir()
	lib := buildLibrary(t, dir, "libsmall.so", 1)
	stripped := buildLibrary(t, dir, "libstripped.so", 2, "-s", "-Wl,--build-id=none")
	files := []fuzzseed.Seed{}
	for _, path := range []string{lib, stripped} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(path)
		files = append(files, fuzzseed.Of(name, data), fuzzseed.Of(name+"-cut", data[:len(data)/3]))
	}
	fuzzseed.Write(t, "FuzzParseELF", files)

	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	section := func(name string) []byte {
		s := f.Section(name)
		if s == nil {
			t.Fatalf("%s: no %s", lib, name)
		}
		data, err := s.Data()
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	symtab, strtab, dynsym, dynstr := section(".symtab"), section(".strtab"), section(".dynsym"), section(".dynstr")
	tables := []fuzzseed.Seed{
		fuzzseed.Of("libsmall.so", symtab, strtab, dynsym, dynstr, false, uint64(0)),
		fuzzseed.Of("libsmall.so-cut", symtab[:len(symtab)-7], strtab[:len(strtab)/2], dynsym, []byte{}, false, uint64(0)),
	}
	// One function per hostile name, at 0x1000 apart.
	var syms, strs []byte
	syms = append(syms, make([]byte, sym64Size)...)
	strs = append(strs, 0)
	for i, name := range hostileNames {
		syms = binary.LittleEndian.AppendUint32(syms, uint32(len(strs)))
		syms = append(syms, byte(elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC)), 0, 1, 0)
		syms = binary.LittleEndian.AppendUint64(syms, uint64(i+1)*0x1000)
		syms = binary.LittleEndian.AppendUint64(syms, 0x100)
		strs = append(append(strs, name...), 0)
	}
	tables = append(tables, fuzzseed.Of("hostile-names", syms, strs, []byte{}, []byte{}, false, uint64(0x3010)))
	fuzzseed.Write(t, "FuzzSymbolTable", tables)
}

// doublingName is a mangled name whose demangled form doubles with each
// template argument: A<int>, then A<S, S> of the previous one, n times. 254
// bytes (n = 22) demangle to 100 MB in 1.4 s; 300 bytes to gigabytes.
func doublingName(n int) string {
	seq := func(i int) string { return "S" + strings.ToUpper(strconv.FormatInt(int64(i), 36)) + "_" }
	name := "_Z1fI1AIiE"
	for i := 1; i <= n; i++ {
		name += "S0_I" + seq(i) + seq(i) + "E"
	}
	return name + "Ev"
}

// Found: a 254-byte symbol name demangled to 100 MB (a name of 300 bytes
// would take gigabytes: the agent killed by one library of one container).
// Fixed: names are demangled to at most maxNameBytes.
func writeRegressions(t *testing.T) {
	syms := make([]byte, sym64Size, 2*sym64Size)
	syms = binary.LittleEndian.AppendUint32(syms, 1)
	syms = append(syms, byte(elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC)), 0, 1, 0)
	syms = binary.LittleEndian.AppendUint64(syms, 0x1000)
	syms = binary.LittleEndian.AppendUint64(syms, 0x100)
	strs := "\x00" + doublingName(22) + "\x00"
	fuzzseed.Write(t, "FuzzSymbolTable", []fuzzseed.Seed{
		fuzzseed.Of("regression-demangled-name-doubles", syms, []byte(strs), []byte{}, []byte{}, false, uint64(0x1000)),
	})
}
