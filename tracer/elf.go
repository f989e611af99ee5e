// Finding the probed functions in a library's ELF symbol tables.

package tracer

import (
	"debug/elf"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gpu-mem/gpu-mem/memory"
)

// The allocator's own functions probed beside its USDT sites, by their C++
// names; their mangled names begin with the prefixes below, whatever
// their parameters (c10::DeviceIndex was an int before torch 2.2).
const (
	restoreFunction        = "NativeCachingAllocator::setCheckpointPoolState"
	rawAllocFunction       = "NativeCachingAllocator::raw_alloc"
	rawAllocStreamFunction = "NativeCachingAllocator::raw_alloc_with_stream"
	rawDeleteFunction      = "NativeCachingAllocator::raw_delete"
	poolBeginFunction      = "NativeCachingAllocator::beginAllocateToPool"
	poolEndFunction        = "NativeCachingAllocator::endAllocateToPool"
)

const nativeAllocator = "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator"

// A function may have had another name: torch 2.1 began and ended
// allocating to a pool per stream (beginAllocateStreamToPool(device,
// stream, pool), endAllocateStreamToPool(device, stream)), 2.2 on per
// filter (pytorch#114647); the probes read neither's arguments.
var functionPrefixes = map[string][]string{
	restoreFunction:        {nativeAllocator + "22setCheckpointPoolStateE"},
	rawAllocFunction:       {nativeAllocator + "9raw_allocE"},
	rawAllocStreamFunction: {nativeAllocator + "21raw_alloc_with_streamE"},
	rawDeleteFunction:      {nativeAllocator + "10raw_deleteE"},
	poolBeginFunction:      {nativeAllocator + "19beginAllocateToPoolE", nativeAllocator + "25beginAllocateStreamToPoolE"},
	poolEndFunction:        {nativeAllocator + "17endAllocateToPoolE", nativeAllocator + "23endAllocateStreamToPoolE"},
}

// allocatorFunction is one of the allocator's own functions in a library:
// its symbol and the offsets of its return instructions from its start.
// Its results are read there, not by a return probe: a return probe
// replaces the return address, which breaks C++ exception unwinding when
// the function throws (raw_alloc when out of memory): the process would
// abort.
type allocatorFunction struct {
	symbol  string
	returns []uint64
}

// allocatorFunctions finds the functions of functionPrefixes among the
// library's symbols (.symtab: torch's allocator functions are local there,
// not in .dynsym), by name, with their return instructions (none when the
// code cannot be decoded, or ends in a tail call: the caller leaves out a
// function whose results it needs then).
func allocatorFunctions(path string) (map[string]allocatorFunction, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	found := map[string]allocatorFunction{}
	for _, read := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		syms, err := read()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return nil, fmt.Errorf("read symbols of %s: %w", path, err)
		}
		for _, s := range syms {
			// A name with a dot is a part or a clone of a function (.cold,
			// .part.0, .isra.0): not its entry.
			if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Value == 0 || strings.Contains(s.Name, ".") {
				continue
			}
			for name, prefixes := range functionPrefixes {
				if _, ok := found[name]; ok || !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(s.Name, p) }) {
					continue
				}
				found[name] = allocatorFunction{symbol: s.Name, returns: returnInstructions(f, s)}
			}
		}
	}
	return found, nil
}

// DriverFunctions lists the traced functions the library exports, with
// their ops, the attach cookies.
func DriverFunctions(path string) ([]string, []uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	exported := map[string]bool{}
	for _, read := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, _ := read() // stripped files lack .symtab; the driver exports in .dynsym
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
				exported[s.Name] = true
			}
		}
	}
	var symbols []string
	var cookies []uint64
	for symbol, op := range memory.Ops() {
		if exported[symbol] {
			symbols = append(symbols, symbol)
			cookies = append(cookies, uint64(op))
		}
	}
	if len(symbols) == 0 {
		return nil, nil, fmt.Errorf("%s exports none of the CUDA memory functions", path)
	}
	return symbols, cookies, nil
}
