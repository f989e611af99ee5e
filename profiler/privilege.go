package profiler

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/logs"
)

// capabilityUses are the capabilities gpumem uses beyond loading BPF
// (CAP_BPF and CAP_PERFMON, without which New fails), each with what is
// lost without it. Any one of a use's caps will do.
var capabilityUses = []struct {
	name string
	caps []uint
	lost string
}{
	{"CAP_SYS_PTRACE", []uint{unix.CAP_SYS_PTRACE},
		"processes of other users, or with capabilities gpumem lacks (those of other containers), cannot be read: " +
			"their driver libraries are not attached, their Python frames and GPU ordinals are unknown"},
	{"CAP_CHECKPOINT_RESTORE", []uint{unix.CAP_CHECKPOINT_RESTORE, unix.CAP_SYS_ADMIN},
		"/proc/PID/map_files cannot be opened: files deleted or replaced since a process mapped them are not symbolized"},
}

// sayMissingCapabilities logs, once, each capability gpumem runs without
// and what that costs, so that what it cannot read is not taken for what
// is not there.
func (p *Profiler) sayMissingCapabilities() {
	eff, err := effectiveCapabilities("/proc/self/status")
	if err != nil {
		logs.Printf(p.cfg.Log, "reading my capabilities: %v", err)
		return
	}
	for _, use := range capabilityUses {
		held := false
		for _, c := range use.caps {
			held = held || eff&(1<<c) != 0
		}
		if !held {
			logs.Printf(p.cfg.Log, "without %s: %s", use.name, use.lost)
		}
	}
}

// effectiveCapabilities reads CapEff from a /proc/PID/status file.
func effectiveCapabilities(status string) (uint64, error) {
	f, err := os.Open(status)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: CapEff %q: %w", status, v, err)
			}
			return eff, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", status, err)
	}
	return 0, fmt.Errorf("%s: no CapEff", status)
}
