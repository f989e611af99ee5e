package schema

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestLossesJSON(t *testing.T) {
	in := Losses{RingBufferFull: 3, TensorArgUnreadable: 7}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"ring_buffer_full":3,"inflight_full":0,"nested_too_deep":0,"result_unreadable":0,"processes_full":0,` +
		`"scratch_busy":0,"contexts_full":0,"tensor_arg_unreadable":7,"allocator_call_incomplete":0}`
	if string(b) != want {
		t.Errorf("marshal: %s, want %s", b, want)
	}
	var out Losses
	if err := json.Unmarshal(b, &out); err != nil || out != in {
		t.Errorf("unmarshal: %v %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"ring_buffer_full":1,"from_the_future":2}`), &out); err == nil ||
		!strings.Contains(err.Error(), "from_the_future") {
		t.Errorf("unknown loss read: %v", err)
	}
	if in.Total() != 10 || Loss(99).String() != "loss(99)" {
		t.Errorf("total %d, %s", in.Total(), Loss(99))
	}
}
