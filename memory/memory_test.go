package memory

import "testing"

// TestViews: every driver kind is in the driver view, tensors alone in the
// tensor view; views read back from their names.
func TestViews(t *testing.T) {
	for k := KindDevice; k <= lastKind; k++ {
		want := ViewDriver
		if k == KindTensor {
			want = ViewTensor
		}
		if k.View() != want {
			t.Errorf("%s is in the %s view, want %s", k, k.View(), want)
		}
	}
	for _, v := range Views {
		if got, ok := ParseView(v.String()); !ok || got != v {
			t.Errorf("ParseView(%q) = %v, %v", v, got, ok)
		}
	}
	if _, ok := ParseView("both"); ok {
		t.Error("ParseView took an unknown view")
	}
}
