package report

import (
	"fmt"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// DescribeOOM is one line: who asked for how much, why it failed (the
// verdict, when judged), and what held the memory.
func DescribeOOM(o snapshot.OOM) string {
	f := o.Failure
	s := fmt.Sprintf("out of memory: pid %d (%s) asked %s through %s on gpu %s", f.PID, Printable(f.Comm), HumanBytes(f.Bytes), f.Op.Symbol(), f.GPU())
	if v := o.Verdict; v != nil {
		s += ": " + v.Verdict + ": " + v.Why
	}
	s += fmt.Sprintf("; it held %s in tensors, %s from the driver",
		HumanBytes(o.HeldBy(memory.KindTensor)), HumanBytes(o.HeldBy(memory.KindDevice)+o.HeldBy(memory.KindVMM)))
	if len(o.Held) > 0 {
		s += fmt.Sprintf("; most (%s, %s) by %s", HumanBytes(o.Held[0].LiveBytes()), o.Held[0].Kind, Printable(HottestFrame(o.Held[0].Frames)))
	}
	return s
}
