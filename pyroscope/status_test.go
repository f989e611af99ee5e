package pyroscope

import "testing"

// TestPushStatusSaysEachFailureOnce: while one error is retried, the
// status line says it in full once, then that it is the same; a new error,
// or the same after a delivery, is said again; a rejection's reason once.
func TestPushStatusSaysEachFailureOnce(t *testing.T) {
	const timeout = "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
	const tls = "rpc error: code = Unavailable desc = connection error: desc = \"transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority\""
	var l StatusLine
	for i, tc := range []struct {
		s    Stats
		want string
	}{
		{Stats{Failed: 1, Queued: 1, LastError: timeout}, ", pushes 0 done 1 failed 0 rejected 0 dropped 1 queued, last error: " + timeout},
		{Stats{Failed: 2, Queued: 2, LastError: timeout}, ", pushes 0 done 2 failed 0 rejected 0 dropped 2 queued, last error: the same"},
		{Stats{Failed: 4, Dropped: 1, Queued: 3, LastError: timeout}, ", pushes 0 done 4 failed 0 rejected 1 dropped 3 queued, last error: the same"},
		{Stats{Failed: 5, Dropped: 2, Queued: 3, LastError: tls}, ", pushes 0 done 5 failed 0 rejected 2 dropped 3 queued, last error: " + tls},
		{Stats{Pushed: 3, Failed: 5, Dropped: 2}, ", pushes 3 done 5 failed 0 rejected 2 dropped 0 queued"},
		{Stats{Pushed: 3, Failed: 6, Dropped: 2, Queued: 1, LastError: tls}, ", pushes 3 done 6 failed 0 rejected 2 dropped 1 queued, last error: " + tls},
		{Stats{Pushed: 4, Failed: 6, Rejected: 1, Dropped: 2, LastRejection: "InvalidArgument: x"}, ", pushes 4 done 6 failed 1 rejected 2 dropped 0 queued, last rejection: InvalidArgument: x"},
		{Stats{Pushed: 4, Failed: 6, Rejected: 2, Dropped: 2, LastRejection: "InvalidArgument: x"}, ", pushes 4 done 6 failed 2 rejected 2 dropped 0 queued"},
	} {
		if got := l.Say(tc.s); got != tc.want {
			t.Errorf("line %d: %q\nwant %q", i+1, got, tc.want)
		}
	}
}
