package adi

import (
	"errors"
	"fmt"
	"testing"
)

// TestRequestErrorsMessage: the joined errors of many failed requests
// name each distinct error once, with a few of the requests it failed,
// and at most maxErrorCauses errors, so that the message stays short
// however many requests failed; errors.Is still finds every one.
func TestRequestErrorsMessage(t *testing.T) {
	down, other := errors.New("peer down"), errors.New("other")
	same := func(n int) requestErrors {
		var errs requestErrors
		for i := range n {
			errs = append(errs, &requestError{i, down})
		}
		return errs
	}
	distinct := requestErrors{{0, down}}
	for i := 1; i < 300; i++ {
		distinct = append(distinct, &requestError{i, fmt.Errorf("truncated to %d: %w", i, other)})
	}
	for _, tc := range []struct {
		name string
		errs requestErrors
		want string
	}{
		{"one", same(1), "request 0: peer down"},
		{"two", same(2), "requests 0 and 1: peer down"},
		{"three", same(3), "requests 0, 1 and 2: peer down"},
		{"many", same(500), "requests 0, 1, 2 and 497 more: peer down"},
		{"mixed", requestErrors{{4, down}, {7, other}, {9, down}},
			"requests 4 and 9: peer down\nrequest 7: other"},
		{"distinct", distinct, "request 0: peer down\nrequest 1: truncated to 1: other\n" +
			"request 2: truncated to 2: other\nrequest 3: truncated to 3: other\n" +
			"and 296 more requests failed in 296 other ways"},
	} {
		err := tc.errs.join()
		if got := err.Error(); got != tc.want {
			t.Errorf("%s: message\n%s\nwant\n%s", tc.name, got, tc.want)
		}
		if !errors.Is(err, down) {
			t.Errorf("%s: errors.Is does not find the requests' error", tc.name)
		}
		if got := len(err.(interface{ Unwrap() []error }).Unwrap()); got != len(tc.errs) {
			t.Errorf("%s: %d errors unwrapped, want one per request (%d)", tc.name, got, len(tc.errs))
		}
	}
	if err := requestErrors(nil).join(); err != nil {
		t.Errorf("no failed request: %v, want nil", err)
	}
}
