package pyroscope

import "fmt"

// StatusLine is the exporter's part of a status line (the agent's, once an
// interval), which says each failure once: the error being retried in
// full on the first line that has it, then that it is the same while it
// lasts; a rejection's reason once, not on every line while the server
// keeps refusing for it.
type StatusLine struct {
	errorLogged     string // the error being retried, said
	rejections      uint64 // at the last line
	rejectionLogged string // the last reason said
}

// Say is the part of the line for s: its counts, the error being retried
// and a new rejection's reason.
func (l *StatusLine) Say(s Stats) string {
	line := fmt.Sprintf(", pushes %d done %d failed %d rejected %d dropped %d queued", s.Pushed, s.Failed, s.Rejected, s.Dropped, s.Queued)
	if s.Expired > 0 {
		line += fmt.Sprintf(", %d expired", s.Expired)
	}
	switch {
	case s.LastError == "":
		l.errorLogged = "" // delivered since: a new failure is said again
	case s.LastError == l.errorLogged:
		line += ", last error: the same"
	default:
		line += ", last error: " + s.LastError
		l.errorLogged = s.LastError
	}
	if s.Rejected > l.rejections && s.LastRejection != l.rejectionLogged {
		line += ", last rejection: " + s.LastRejection
		l.rejectionLogged = s.LastRejection
	}
	l.rejections = s.Rejected
	return line
}
