package multidevice

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// TestCompleteWakesDone races Done against each way of completing a
// request: a goroutine that asked for the channel must always be woken,
// and the status must be the completer's (run with -race).
func TestCompleteWakesDone(t *testing.T) {
	errX := errors.New("x")
	for _, tc := range []struct {
		name     string
		complete func(r *Request)
	}{
		{"complete", func(r *Request) { r.complete(Status{Count: 7}, errX) }},
		{"completeOwned", func(r *Request) { r.completeOwned(Status{Count: 7}, errX) }},
		{"two completers", func(r *Request) {
			var wg sync.WaitGroup
			wg.Go(func() { r.complete(Status{Count: 7}, errX) })
			wg.Go(func() { r.complete(Status{Count: 7}, errX) })
			wg.Wait()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Device{}
			for i := range 2000 {
				r := &Request{d: d}
				woke := make(chan struct{})
				go func() {
					<-r.Done()
					r.awaitDone()
					close(woke)
				}()
				if i%2 == 0 {
					time.Sleep(time.Microsecond) // let Done come first sometimes
				}
				tc.complete(r)
				select {
				case <-woke:
				case <-time.After(10 * time.Second):
					t.Fatalf("round %d: Done's channel never closed", i)
				}
				if st, done, err := r.Test(); !done || st.Count != 7 || err != errX {
					t.Fatalf("round %d: Test = %+v, %v, %v", i, st, done, err)
				}
				if r.complete(Status{}, nil) {
					t.Fatalf("round %d: completed twice", i)
				}
			}
		})
	}
}
