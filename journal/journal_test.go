package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var owner = Owner{Object: [32]byte{1, 2, 3}, Boot: "boot-1", Ring: 7}

type record struct {
	kind Kind
	pos  uint64
	data string
}

func replay(t *testing.T, j *Journal) []record {
	t.Helper()
	var got []record
	if err := j.Replay(func(kind Kind, pos uint64, payload []byte) error {
		got = append(got, record{kind, pos, string(payload)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

func open(t *testing.T, dir string, o Owner) (*Journal, *Refusal) {
	t.Helper()
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	refusal, err := j.Continue(o)
	if err != nil {
		t.Fatal(err)
	}
	return j, refusal
}

// TestJournalContinued: records appended by one owner are replayed by the
// next, whole records only (one cut short by a crash in its write is
// dropped: its ring position was not committed), and the journal goes on
// after them; a rewrite keeps the position it covers.
func TestJournalContinued(t *testing.T) {
	dir := t.TempDir()
	j, refusal := open(t, dir, owner)
	if refusal != nil || len(replay(t, j)) != 0 {
		t.Fatalf("a new journal: refused %v", refusal)
	}
	want := []record{{KindRing, 0, "first"}, {KindRing, 16, "second record"}, {KindCarried, 0, "{}"}}
	var recs []byte
	for _, r := range want {
		recs = AppendRecord(recs, r.kind, r.pos, []byte(r.data))
	}
	if err := j.Append(recs); err != nil {
		t.Fatal(err)
	}
	if err := j.Append(AppendRecord(nil, KindRing, 40, []byte("cut"))[:20]); err != nil { // the crash
		t.Fatal(err)
	}
	j.Close()

	j, refusal = open(t, dir, owner)
	if got := replay(t, j); refusal != nil || !slices.Equal(got, want) {
		t.Fatalf("continued: %v, refused %v; want %v", got, refusal, want)
	}
	if err := j.Append(AppendRecord(nil, KindRing, 40, []byte("after"))); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j, _ = open(t, dir, owner)
	if got := replay(t, j); len(got) != 4 || got[3] != (record{KindRing, 40, "after"}) {
		t.Fatalf("after the cut record: %v", got)
	}
	if err := j.Rewrite(4096, AppendRecord(nil, KindRing, 40, []byte("after"))); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j, _ = open(t, dir, owner)
	defer j.Close()
	if got := replay(t, j); j.Covered() != 4096 || len(got) != 1 || j.Size() != HeaderSize+24 {
		t.Fatalf("rewritten: %v, covering %d, %d bytes", got, j.Covered(), j.Size())
	}
}

// TestJournalRefused: a journal of another owner, another format, or
// corrupt, is started afresh, with its reason.
func TestJournalRefused(t *testing.T) {
	for _, c := range []struct {
		reason string
		change func(dir string)
	}{
		{"object", func(string) {}}, // continued by another object, below
		{"version", func(dir string) { patch(t, dir, 8, 9) }},
		{"corrupt", func(dir string) { patch(t, dir, HeaderSize+4, 99) }}, // a record of no kind
		{"corrupt", func(dir string) { patch(t, dir, 0, 'X') }},
	} {
		t.Run(c.reason, func(t *testing.T) {
			dir := t.TempDir()
			j, _ := open(t, dir, owner)
			j.Append(AppendRecord(nil, KindRing, 0, []byte("kept")))
			j.Close()
			c.change(dir)
			next := owner
			if c.reason == "object" {
				next.Object[0]++
			}
			j, refusal := open(t, dir, next)
			defer j.Close()
			if refusal == nil || refusal.Reason != c.reason || len(replay(t, j)) != 0 || j.Size() != HeaderSize {
				t.Fatalf("refusal %+v, %d bytes", refusal, j.Size())
			}
		})
	}
	for reason, other := range map[string]Owner{"boot": {Object: owner.Object, Boot: "boot-2", Ring: 7}, "ring": {Object: owner.Object, Boot: "boot-1", Ring: 8}} {
		dir := t.TempDir()
		j, _ := open(t, dir, owner)
		j.Close()
		j, refusal := open(t, dir, other)
		j.Close()
		if refusal == nil || refusal.Reason != reason {
			t.Errorf("another %s: refusal %+v", reason, refusal)
		}
	}
}

// patch sets one byte of dir's journal.
func patch(t *testing.T, dir string, at int, b byte) {
	path := filepath.Join(dir, fileName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[at] = b
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestJournalOwnedOnce: a second Open fails while the first owner holds
// the journal, naming it; Clear too; once closed, both succeed.
func TestJournalOwnedOnce(t *testing.T) {
	dir := t.TempDir()
	j, _ := open(t, dir, owner)
	_, err := Open(dir)
	if want := fmt.Sprintf("another gpumem agent owns the state at %s (pid %d)", dir, os.Getpid()); !errors.Is(err, ErrLocked) || err.Error() != want {
		t.Fatalf("a second owner: %v, want %q", err, want)
	}
	if err := Clear(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("cleared while owned: %v", err)
	}
	j.Close()
	if err := Clear(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, fileName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the journal after Clear: %v", err)
	}
	if err := Clear(filepath.Join(dir, "none")); err != nil {
		t.Fatalf("clearing no state: %v", err)
	}
}
