// Command usdtfloor puts empty programs on the pytorch:malloc and
// pytorch:free USDT sites of a libc10_cuda.so, with their semaphores, as
// gpu-mem's tensor view does: the traps alone, the floor of any tracer of
// those probes. It prints "attached N" and holds until interrupted. Usage:
// usdtfloor LIBC10_CUDA
package main

import (
	"fmt"
	"os"
	"os/signal"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/gpu-mem/gpu-mem/usdt"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: usdtfloor LIBC10_CUDA")
		os.Exit(2)
	}
	probes, err := usdt.Read(os.Args[1])
	check(err)
	var addrs, refs []uint64
	for _, p := range probes {
		if p.Provider == "pytorch" && (p.Name == "malloc" || p.Name == "free") {
			addrs, refs = append(addrs, p.Offset), append(refs, p.SemaphoreOffset)
		}
	}
	if len(addrs) == 0 {
		check(fmt.Errorf("%s: no pytorch:malloc or pytorch:free probes", os.Args[1]))
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.Kprobe, AttachType: ebpf.AttachTraceUprobeMulti, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	check(err)
	ex, err := link.OpenExecutable(os.Args[1])
	check(err)
	l, err := ex.UprobeMulti(nil, prog, &link.UprobeMultiOptions{Addresses: addrs, RefCtrOffsets: refs})
	check(err)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt) // before saying so: the harness interrupts once told
	fmt.Printf("attached %d\n", len(addrs))
	<-stop
	l.Close()
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "usdtfloor:", err)
		os.Exit(1)
	}
}
