// The state a Tracer leaves to the next one on the node: its maps and the
// driver's probes pinned on a BPF file system, its ring buffer's records
// journaled on the host (package journal).

package tracer

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/journal"
)

// State says where a Tracer's state outlives it.
type State struct {
	// PinPath is a directory on a BPF file system: the maps and the
	// driver's probes are pinned under it, so that the probes go on
	// firing into the ring buffer while no agent runs.
	PinPath string
	// Journal is the journal of what the tracer read, opened (and so
	// owned) by the caller.
	Journal *journal.Journal
}

// Continued says what a Tracer found of the state its predecessor left.
type Continued struct {
	// Records replayed from the journal, and ring buffer bytes waiting,
	// written while no agent ran.
	Records, Waiting uint64
	// DriverOff are the processes whose driver view a predecessor
	// switched off (SwitchDriverOff): still off.
	DriverOff []uint32
	// Refused says why the state found was not continued (nil: it was, or
	// there was none). Reason is a short word for a metric's label.
	Refused *journal.Refusal
}

const bpfFSMagic = 0xcafe4a11

// checkBPFFS makes sure path is on a BPF file system, where pins live.
func checkBPFFS(path string) error {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return fmt.Errorf("make pin path: %w", err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return fmt.Errorf("pin path: %w", err)
	}
	if uint32(fs.Type) != bpfFSMagic {
		return fmt.Errorf("pin path %s is not on a BPF file system (mount -t bpf bpf /sys/fs/bpf)", path)
	}
	return nil
}

func (s *State) mapsDir() string  { return filepath.Join(s.PinPath, "maps") }
func (s *State) linksDir() string { return filepath.Join(s.PinPath, "links") }

// pinMaps has every map the programs share pinned by name, and found
// pinned when a predecessor left them.
func pinMaps(spec *ebpf.CollectionSpec) {
	for name, m := range spec.Maps {
		if !strings.HasPrefix(name, ".") { // .rodata and .bss are each load's own
			m.Pinning = ebpf.PinByName
		}
	}
}

// objectSum names the BPF object and the settings it was loaded with in
// the journal: the pinned probes run the programs that wrote its records,
// which only a tracer loading the same continues.
func objectSum(object []byte, opts Options) [32]byte {
	h := sha256.New()
	h.Write(object)
	fmt.Fprintf(h, "filter_pids=%t tensor_native_stacks=%t", len(opts.PIDs) > 0, opts.TensorNativeStacks)
	return [32]byte(h.Sum(nil))
}

// bootID names this boot: state of an earlier one is gone with its processes.
func bootID() (string, error) {
	id, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	return strings.TrimSpace(string(id)), nil
}

// continueState takes up the journal of the state found, if it is this
// tracer's: its records are replayed before the ring's, and the ring is
// read from where the journal ends. Otherwise what was found is dropped:
// the pinned probes detached, the ring's records let go.
func (t *Tracer) continueState(object []byte, opts Options) (Continued, error) {
	var c Continued
	j := t.state.Journal
	refusal, err := j.Continue(t.owner(object, opts))
	if err != nil {
		return c, err
	}
	if refusal != nil {
		// The probes found run another's programs: detached, this
		// tracer's attached instead, the records they sent let go.
		c.Refused = refusal
		closeAll(t.exit)
		if err := os.RemoveAll(t.state.linksDir()); err != nil {
			return c, fmt.Errorf("unpin the probes found: %w", err)
		}
		if err := t.attachExit(); err != nil {
			return c, err
		}
		t.ring.skipAll()
		return c, nil
	}
	end := j.Covered()
	err = j.Replay(func(kind journal.Kind, pos uint64, raw []byte) error {
		c.Records++
		if kind == journal.KindCarried {
			t.carried = bytes.Clone(raw)
			return nil
		}
		t.batch.add(pos, raw)
		end = max(end, pos+recordSpan(len(raw)))
		return nil
	})
	if err != nil {
		return c, err
	}
	t.ring.skipTo(end)
	c.Waiting = t.ring.pending()
	var pid uint32
	var calls uint64
	for it := t.objs.DriverOff.Iterate(); it.Next(&pid, &calls); {
		c.DriverOff = append(c.DriverOff, pid)
	}
	return c, nil
}

// recordSpan is how far a record of n bytes moves the ring's position.
func recordSpan(n int) uint64 { return (uint64(n) + ringHeader + 7) &^ 7 }

// pinned adopts the links pinned under name, or makes them with attach and
// pins them there; without a pin path, it only makes them.
func (t *Tracer) pinned(name string, attach func() ([]link.Link, error)) ([]link.Link, error) {
	if t.state == nil {
		return attach()
	}
	dir := filepath.Join(t.state.linksDir(), name)
	if links, err := loadPinnedLinks(dir); err != nil || len(links) > 0 {
		return links, err
	}
	links, err := attach()
	if err != nil {
		return nil, err
	}
	if err := pinLinks(dir, links); err != nil {
		closeAll(links)
		return nil, err
	}
	return links, nil
}

// loadPinnedLinks opens the links pinned in dir, in their order.
func loadPinnedLinks(dir string) ([]link.Link, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pinned probes: %w", err)
	}
	var links []link.Link
	for _, e := range entries {
		l, err := link.LoadPinnedLink(filepath.Join(dir, e.Name()), nil)
		if err != nil {
			closeAll(links)
			return nil, fmt.Errorf("open pinned probe %s: %w", e.Name(), err)
		}
		links = append(links, l)
	}
	return links, nil
}

func pinLinks(dir string, links []link.Link) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make pin directory: %w", err)
	}
	for i, l := range links {
		if err := l.Pin(filepath.Join(dir, fmt.Sprint(i))); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("pin probe: %w", err)
		}
	}
	return nil
}

// fileKey names a file's pins: its device and inode, whatever its path.
func fileKey(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	return fmt.Sprintf("%d-%d", st.Dev, st.Ino), nil
}

// ClearState removes the state left under pinPath: the probes pinned there
// are detached, the maps freed once no program holds them. For an agent
// taken off a node for good (gpumem state clear).
func ClearState(pinPath string) error {
	if err := os.RemoveAll(pinPath); err != nil {
		return fmt.Errorf("remove %s: %w", pinPath, err)
	}
	return nil
}
