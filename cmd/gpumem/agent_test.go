package main

import "testing"

// TestMemoryLimitFollowsTheContainer: the Go heap's bound is the container's
// limit less what lives outside the heap, never below the floor, 128 MiB
// without a limit; a value that is not bytes is refused.
func TestMemoryLimitFollowsTheContainer(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int64
	}{
		{"", 128 << 20},
		{"268435456", 192 << 20}, // the chart's 256Mi
		{"100000000", 64 << 20},
	} {
		t.Setenv("GPUMEM_MEMORY_LIMIT", tc.env)
		if got, err := memoryLimit(); err != nil || got != tc.want {
			t.Errorf("GPUMEM_MEMORY_LIMIT=%q: %d %v, want %d", tc.env, got, err, tc.want)
		}
	}
	for _, bad := range []string{"256Mi", "-1", "0"} {
		t.Setenv("GPUMEM_MEMORY_LIMIT", bad)
		if _, err := memoryLimit(); err == nil {
			t.Errorf("GPUMEM_MEMORY_LIMIT=%q accepted", bad)
		}
	}
}
