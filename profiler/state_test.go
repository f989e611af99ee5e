package profiler

import (
	"maps"
	"testing"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// TestCompactionCarriesWhatItDrops: books replayed from a compacted
// journal (the carried counters, then the events compaction kept) are the
// books it was compacted from: each stack's live bytes, each process's
// counters and failures, a VMM handle's references; an exited process
// leaves nothing.
func TestCompactionCarriesWhatItDrops(t *testing.T) {
	const mib = 1 << 20
	retain := opNamed(t, "cuMemRetainAllocationHandle")
	ev := func(op memory.Op, pid uint32, addr, bytes, ts uint64, stack uint64) tracer.Event {
		return tracer.Event{Op: op, PID: pid, TID: pid, Address: addr, Bytes: bytes, Timestamp: ts, Stack: []uint64{stack}}
	}
	oom := ev(memory.OpMemAlloc, 1, 0, 8<<30, 8, 4)
	oom.Result = memory.CUDAOutOfMemory
	events := []tracer.Event{
		ev(memory.OpCtxCreate, 1, 0xc0, 0, 1, 5),
		ev(memory.OpMemAlloc, 1, 0xa000, 1*mib, 2, 1),
		ev(memory.OpMemAlloc, 1, 0xb000, 2*mib, 3, 2),
		ev(memory.OpMemFree, 1, 0xa000, 0, 4, 0),
		ev(memory.OpMemAlloc, 1, 0xa000, 3*mib, 5, 1), // the address again
		ev(memory.OpMemCreate, 1, 0x77, 4*mib, 6, 3),
		ev(retain, 1, 0x77, 0, 7, 0),
		ev(memory.OpMemRelease, 1, 0x77, 0, 8, 0), // a reference left: still live
		oom,
		ev(memory.OpMemAlloc, 2, 0xd000, 5*mib, 9, 6),
		{Exit: true, PID: 2, TID: 2, Timestamp: 10},
	}
	account := func(b *books, evs []tracer.Event) {
		for i := range evs {
			var id accounting.StackID
			if len(evs[i].Stack) > 0 {
				id = accounting.StackID(evs[i].Stack[0])
			}
			b.account(&evs[i], id, false)
		}
	}
	before := newBooks()
	account(before, events)

	c := before.compaction()
	var kept []tracer.Event
	for _, e := range events {
		if c.Needs(&e) {
			kept = append(kept, e)
		}
	}
	after := newBooks()
	if err := after.carry(c.Carried()); err != nil {
		t.Fatal(err)
	}
	account(after, kept)
	if len(kept) != 6 {
		t.Errorf("kept %d events, want 6 (the context, two live allocations, the handle's creation, retain and release): %+v", len(kept), kept)
	}

	live := func(b *books) map[accounting.StackID]uint64 {
		m := map[accounting.StackID]uint64{}
		b.ledger.Rows(func(k accounting.Key, n accounting.Counters) {
			if k.PID == 1 && n.LiveBytes() > 0 {
				m[k.Stack] += n.LiveBytes()
			}
		})
		return m
	}
	if got, want := live(after), live(before); !maps.Equal(got, want) || want[1] != 3*mib || want[2] != 2*mib || want[3] != 4*mib {
		t.Errorf("live bytes by stack replayed %v, before %v", got, want)
	}
	totals := func(b *books) (accounting.Counters, accounting.Failures) {
		var c accounting.Counters
		var f accounting.Failures
		b.ledger.Rows(func(k accounting.Key, n accounting.Counters) {
			if k.PID == 1 {
				c.Add(n)
			}
		})
		b.ledger.EachFailure(func(k accounting.FailureKey, n accounting.Failures) { f.Add(n) })
		return c, f
	}
	gotC, gotF := totals(after)
	wantC, wantF := totals(before)
	if gotC != wantC || gotF != wantF {
		t.Errorf("replayed counters %+v failures %+v, before %+v %+v", gotC, gotF, wantC, wantF)
	}
	if wantC.AllocBytes != 10*mib || wantC.FreeCount != 1 || wantF.Count != 1 {
		t.Errorf("the books before: %+v %+v", wantC, wantF)
	}
	// The handle's references replayed: its last release frees it.
	release := []tracer.Event{ev(memory.OpMemRelease, 1, 0x77, 0, 11, 0)}
	account(before, release)
	account(after, release)
	if got, want := live(after), live(before); !maps.Equal(got, want) || want[3] != 0 {
		t.Errorf("after the handle's last release: replayed %v, before %v", got, want)
	}
	if _, ok := after.ledger.Row(accounting.Key{PID: 2, Kind: memory.KindDevice}); ok {
		t.Error("the exited process is carried")
	}
}
