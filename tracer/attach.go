// The driver library's probes: every CUDA memory and context function it
// exports, entry and return.

package tracer

import (
	"fmt"

	"github.com/cilium/ebpf/link"

	"github.com/gpu-mem/gpu-mem/memory"
)

// Attach puts the entry probes on every driver function that the library
// at path exports, and return probes on all but the frees, which are
// reported at their entry (one trap fewer per free). It returns the
// functions it found. Symbols a driver version lacks (the _ptsz variants,
// say) are skipped; a library exporting none of them is an error.
func (t *Tracer) Attach(path string) ([]string, error) {
	symbols, cookies, err := DriverFunctions(path)
	if err != nil {
		return nil, err
	}
	key, err := fileKey(path)
	if err != nil {
		return nil, err
	}
	links, err := t.pinned("driver-"+key, func() ([]link.Link, error) { return t.attachDriver(path, symbols, cookies) })
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.links = append(t.links, links...)
	t.mu.Unlock()
	return symbols, nil
}

// attachDriver puts the entry and return probes on the driver library at path.
func (t *Tracer) attachDriver(path string, symbols []string, cookies []uint64) ([]link.Link, error) {
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	enter, err := ex.UprobeMulti(symbols, t.objs.GpumemEnter, &link.UprobeMultiOptions{Cookies: cookies})
	if err != nil {
		return nil, fmt.Errorf("attach entry probes to %s: %w", path, err)
	}
	links := []link.Link{enter}
	if returning, returnCookies := withoutFrees(symbols, cookies); len(returning) > 0 {
		leave, err := ex.UretprobeMulti(returning, t.objs.GpumemLeave, &link.UprobeMultiOptions{Cookies: returnCookies})
		if err != nil {
			enter.Close()
			return nil, fmt.Errorf("attach return probes to %s: %w", path, err)
		}
		links = append(links, leave)
	}
	return links, nil
}

// withoutFrees keeps the functions whose return is probed.
func withoutFrees(symbols []string, cookies []uint64) ([]string, []uint64) {
	var s []string
	var c []uint64
	for i, op := range cookies {
		if !memory.Op(op).IsFree() {
			s, c = append(s, symbols[i]), append(c, op)
		}
	}
	return s, c
}
