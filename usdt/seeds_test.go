//go:build fuzzseed

// The seed corpora of usdt's fuzz targets (testdata/fuzz), written by
// go generate -tags fuzzseed (make fuzz-seeds), not by go test.

package usdt

//go:generate go test -tags fuzzseed -run ^TestWriteSeeds$ -count=1 .

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
)

// probesLibrary has torch 2.11's probes (pytorch:malloc with a register, a
// byte register, a frame slot; pytorch:free) behind semaphores in
// .probes, and a probe with a constant.
const probesLibrary = `
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <stdint.h>
unsigned short pytorch_malloc_semaphore __attribute__((section(".probes"))) __attribute__((used));
unsigned short pytorch_free_semaphore __attribute__((section(".probes"))) __attribute__((used));
unsigned short gpumem_constant_semaphore __attribute__((section(".probes"))) __attribute__((used));
void *simalloc(int8_t device, unsigned long size, void *stream) {
	void *p = (void *)(size * 3);
	volatile long slot = (long)stream;
	if (pytorch_malloc_semaphore) STAP_PROBE4(pytorch, malloc, p, device, size, slot);
	return p;
}
void simfree(void *p) {
	if (pytorch_free_semaphore) STAP_PROBE1(pytorch, free, p);
	STAP_PROBE1(gpumem, constant, 42);
}
`

// realNotes are the .note.stapsdt sections of files on every machine of
// this kind: CPython 3.11's (22 probes) and libstdc++'s.
var realNotes = map[string]string{
	"python3.11": "/usr/bin/python3.11",
	"libstdc++":  "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
}

// TestWriteSeeds writes FuzzNotes's, FuzzRead's and FuzzParseArg's seeds:
// a library with torch's probes built here, the notes of realNotes, and
// the operands of all of them and of torch 2.11's libc10_cuda.so.
func TestWriteSeeds(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "probes.c")
	if err := os.WriteFile(src, []byte(probesLibrary), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(name string, flags ...string) string {
		lib := filepath.Join(dir, name)
		args := append([]string{"-O1", "-shared", "-fPIC", "-s", "-o", lib, src}, flags...)
		if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
			t.Fatalf("cc: %v\n%s", err, out)
		}
		return lib
	}
	lib := build("libprobes.so")
	// FuzzRead's, linked without the C library and with segments aligned
	// to 64 bytes, not pages: 2664 bytes, where lib takes 14392, 90% of
	// them zeros (page padding) that the fuzzer mutated for nothing.
	compact := build("libprobes-compact.so", "-nostdlib", "-Wl,--build-id=none", "-Wl,-z,noseparate-code", "-Wl,-z,max-page-size=0x40")
	small, err := os.ReadFile(compact)
	if err != nil {
		t.Fatal(err)
	}
	if probes, err := Read(compact); err != nil || len(probes) != 3 {
		t.Fatalf("%s: %d probes, %v", compact, len(probes), err)
	}
	files := map[string]string{"libprobes.so": lib}
	for name, path := range realNotes {
		files[name] = path
	}
	var notes []fuzzseed.Seed
	specs := map[string]bool{}
	for name, path := range files {
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		data, err := f.Section(".note.stapsdt").Data()
		if err != nil {
			t.Fatal(err)
		}
		notes = append(notes, fuzzseed.Of(name, data, uint64(0)))
		if base := f.Section(".stapsdt.base"); base != nil {
			notes = append(notes, fuzzseed.Of(name+"-prelinked", data, base.Addr+0x1000))
		}
		probes, err := readFile(f)
		f.Close()
		if err != nil || len(probes) == 0 {
			t.Fatalf("%s: %d probes, %v", path, len(probes), err)
		}
		for _, s := range noteArgStrings(data) {
			for _, spec := range strings.Fields(s) {
				specs[spec] = true
			}
		}
	}
	fuzzseed.Write(t, "FuzzNotes", notes)
	fuzzseed.Write(t, "FuzzRead", []fuzzseed.Seed{
		fuzzseed.Of("libprobes.so", small),
		fuzzseed.Of("libprobes.so-headers", small[:64]),
		fuzzseed.Of("libprobes.so-half", small[:len(small)/2]),
	})
	// The operands of torch 2.11's libc10_cuda.so (usdt_test.go) and of
	// the files above.
	for _, spec := range []string{"8@%rax", "1@%dl", "-1@%dl", "8@%r14", "8@-56(%rbp)", "8@%rdi", "8@(%r12)", "-4@%r8d", "2@0x10(%rsp)", "-8@$-3", "8@-8(%rbp,%rax,8)"} {
		specs[spec] = true
	}
	var args []fuzzseed.Seed
	for _, spec := range slices.Sorted(func(yield func(string) bool) {
		for s := range specs {
			if !yield(s) {
				return
			}
		}
	}) {
		args = append(args, fuzzseed.Of(fmt.Sprintf("arg-%02d", len(args)), spec))
	}
	fuzzseed.Write(t, "FuzzParseArg", args)
}

// noteArgStrings are the argument strings of a section's stapsdt notes.
func noteArgStrings(data []byte) []string {
	var out []string
	for len(data) > 0 {
		desc, typ, rest, err := nextNote(data)
		if err != nil {
			break
		}
		data = rest
		if typ == stapsdt && len(desc) > 24 {
			if strs := bytes.SplitN(desc[24:], []byte{0}, 4); len(strs) >= 3 {
				out = append(out, string(strs[2]))
			}
		}
	}
	return out
}
