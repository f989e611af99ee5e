// Command callcount counts the calls a program makes to each driver
// function gpu-mem probes: which probes a workload pays for. Usage:
// callcount LIBCUDA -- COMMAND [ARG...]
package main

import (
	"fmt"
	"os"
	"os/exec"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/gpu-mem/gpu-mem/tracer"
)

func main() {
	if len(os.Args) < 4 || os.Args[2] != "--" {
		fmt.Fprintln(os.Stderr, "usage: callcount LIBCUDA -- COMMAND [ARG...]")
		os.Exit(2)
	}
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 256})
	check(err)
	// counts[cookie]++ : r6 = cookie; lookup; atomic add.
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.Kprobe, AttachType: ebpf.AttachTraceUprobeMulti, License: "GPL",
		Instructions: asm.Instructions{
			asm.FnGetAttachCookie.Call(),
			asm.StoreMem(asm.RFP, -4, asm.R0, asm.Word),
			asm.LoadMapPtr(asm.R1, counts.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.Add.Imm(asm.R1, 1),
			asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
			asm.Return(),
		},
	})
	check(err)
	symbols, cookies, err := tracer.DriverFunctions(os.Args[1])
	check(err)
	ex, err := link.OpenExecutable(os.Args[1])
	check(err)
	l, err := ex.UprobeMulti(symbols, prog, &link.UprobeMultiOptions{Cookies: cookies})
	check(err)
	defer l.Close()
	cmd := exec.Command(os.Args[3], os.Args[4:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	check(cmd.Run())
	type row struct {
		name string
		n    uint64
	}
	var rows []row
	for i, sym := range symbols {
		var per []uint64
		check(counts.Lookup(uint32(cookies[i]), &per))
		var n uint64
		for _, v := range per {
			n += v
		}
		rows = append(rows, row{sym, n})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].n > rows[j].n })
	for _, r := range rows {
		fmt.Printf("calls %-30s %d\n", r.name, r.n)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "callcount:", err)
		os.Exit(1)
	}
}
