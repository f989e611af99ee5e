package profiler

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEffectiveCapabilities(t *testing.T) {
	status := filepath.Join(t.TempDir(), "status")
	// The chart's capabilities: SYS_PTRACE, PERFMON, BPF, CHECKPOINT_RESTORE.
	data := "Name:\tgpumem\nCapInh:\t0000000000000000\nCapPrm:\t000001c000080000\nCapEff:\t000001c000080000\n"
	if err := os.WriteFile(status, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if eff, err := effectiveCapabilities(status); err != nil || eff != 0x1c000080000 {
		t.Errorf("CapEff %x, %v", eff, err)
	}
	if err := os.WriteFile(status, []byte("Name:\tx\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := effectiveCapabilities(status); err == nil {
		t.Error("no error without CapEff")
	}
}
