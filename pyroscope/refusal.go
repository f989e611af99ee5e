package pyroscope

import (
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// What a failed push means for the interval it carried. Grafana Pyroscope
// (v2.2.1, read from its source: pkg/distributor/distributor.go,
// pkg/validation/validate.go) answers a push it will never take, whatever
// the moment, with InvalidArgument: no series ("no profiles received"),
// a profile outside the ingestion window, too large, malformed, or a series
// whose labels it refuses. Sending such a request again gets the same
// answer, and a request retried at the head of the queue holds back every
// interval behind it: it is dropped at once. What may pass later (the
// server or the way to it down or overloaded, rate limits, timeouts,
// credentials a proxy refuses for now) is retried.

// verdict is what the exporter does with an interval whose push failed.
type verdict int

const (
	// retry: send it again after a backoff; the queue's bound still drops
	// the oldest interval when it is full, so a failure that lasts never
	// holds back newer data beyond the queue.
	retry verdict = iota
	// drop: the server refused the request for what it holds.
	drop
)

// grpcHTTPStatus is how grpc-go reports an answer that is not gRPC (a proxy
// or load balancer answering with a plain HTTP status): the status's code is
// then only grpc-go's guess from the HTTP status (400 -> Internal, 413 and
// 422 -> Unknown), so the HTTP status is read from the message.
const grpcHTTPStatus = "unexpected HTTP status code received from server: "

// grpcMarshal begins grpc-go's message for a request it cannot encode.
const grpcMarshal = "grpc: error while marshaling"

// judge says what to do with an interval whose push failed with err, and
// why, in a word fit for a metric label: the gRPC code, or "HTTP 413".
func judge(err error) (verdict, string) {
	st, ok := status.FromError(err)
	if !ok {
		// Not a gRPC status: the call did not reach a server.
		return retry, codes.Unavailable.String()
	}
	if code, ok := httpStatus(st.Message()); ok {
		return judgeHTTP(code), "HTTP " + strconv.Itoa(code)
	}
	if st.Code() == codes.Internal && strings.HasPrefix(st.Message(), grpcMarshal) {
		// The request never left: it would fail the same way each time.
		return drop, "Marshal"
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return drop, st.Code().String()
	}
	// Unavailable, DeadlineExceeded, ResourceExhausted (rate limits),
	// Aborted, Internal, Unknown, Unauthenticated, PermissionDenied and
	// whatever else: not known to be about the request, so not dropped.
	return retry, st.Code().String()
}

// judgeHTTP: 400, 413 and 422 refuse the request itself; the rest
// (429, 5xx, 401, 403, 404 of a misrouted URL) may pass later.
func judgeHTTP(code int) verdict {
	switch code {
	case 400, 413, 422:
		return drop
	}
	return retry
}

// httpStatus reads the HTTP status from grpc-go's message for a non-gRPC
// answer.
func httpStatus(msg string) (int, bool) {
	i := strings.Index(msg, grpcHTTPStatus)
	if i < 0 {
		return 0, false
	}
	digits, _, _ := strings.Cut(msg[i+len(grpcHTTPStatus):], " ")
	code, err := strconv.Atoi(digits)
	return code, err == nil
}

// Bounds on a refusal's message. The server's messages quote the series'
// labels and the faulty value, which may be long, and say what is wrong
// between the two: each long word is cut, then the whole.
const (
	maxWord        = 64
	maxDescription = 600
)

// describe is a refusal for the status line: the reason and the server's
// message, which never holds the request's credentials, shortened.
func describe(reason string, err error) string {
	words := strings.Split(status.Convert(err).Message(), " ")
	for i, w := range words {
		if len(w) > maxWord {
			words[i] = strings.ToValidUTF8(w[:maxWord], "") + "..."
		}
	}
	msg := strings.Join(words, " ")
	if len(msg) > maxDescription {
		msg = strings.ToValidUTF8(msg[:maxDescription], "") + "..."
	}
	return reason + ": " + msg
}
