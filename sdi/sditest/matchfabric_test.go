package sditest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// matchEvents records a MatchDev's Handler calls as text, without
// blocking the device's goroutine.
type matchEvents chan string

func (h matchEvents) Deliver(from sdi.Rank, _, payload []byte) {
	h <- fmt.Sprintf("deliver from %d: %s", from, payload)
}

func (h matchEvents) SendDone(token uint64, err error) {
	h <- fmt.Sprintf("send %d done: %v", token, err)
}

func (h matchEvents) PeerDown(peer sdi.Rank, _ error) {
	h <- fmt.Sprintf("rank %d down", peer)
}

// openMatchRanks opens n ranks on a fresh MatchFabric, closed when t ends.
func openMatchRanks(t *testing.T, n int) (*MatchFabric, []*MatchDev, []matchEvents) {
	t.Helper()
	f := NewMatchFabric()
	devs := make([]*MatchDev, n)
	evs := make([]matchEvents, n)
	for r := range n {
		devs[r] = f.New(nil).(*MatchDev)
		evs[r] = make(matchEvents, 16)
		if _, err := devs[r].Open(context.Background(), sdi.OpenParams{Rank: sdi.Rank(r), Handler: evs[r]}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { devs[r].Close(context.Background()) })
	}
	return f, devs, evs
}

// nextEvent waits for one Handler call, failing t after a second.
func nextEvent(t *testing.T, evs matchEvents) string {
	t.Helper()
	select {
	case ev := <-evs:
		return ev
	case <-time.After(time.Second):
		t.Fatal("no Handler call within a second")
		return ""
	}
}

// waitUnexpected waits until rank d holds an unexpected message from src
// with tag 5 on context 2.
func waitUnexpected(t *testing.T, d *MatchDev, src sdi.Rank) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := d.Probe(src, 5, 2); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the message never arrived unexpected")
		}
	}
}

// TestMatchFabricMatching: the fake matches as the multidevice's tests
// expect of a matching subdevice (sdi.Matcher), whichever of the message
// and the receive comes first: wildcards, contexts, a synchronous send
// completed only once matched, and a duplicated receive claimed
// elsewhere dropped without Done. Those tests prove the multidevice
// right only as far as the fake is.
func TestMatchFabricMatching(t *testing.T) {
	for _, tc := range []struct {
		name      string
		postFirst bool // the receive is posted before the message arrives
		sync      bool
		src       sdi.Rank
		tag       int32
		ctx       uint64
		claimed   bool // the receive's claim was taken elsewhere
		cancel    bool // the receive is cancelled before the message is sent
		wantMatch bool
	}{
		{name: "posted first", postFirst: true, src: 0, tag: 5, ctx: 2, wantMatch: true},
		{name: "unexpected first", src: 0, tag: 5, ctx: 2, wantMatch: true},
		{name: "wildcards", postFirst: true, src: sdi.AnySource, tag: sdi.AnyTag, ctx: 2, wantMatch: true},
		{name: "wildcards, unexpected first", src: sdi.AnySource, tag: sdi.AnyTag, ctx: 2, wantMatch: true},
		{name: "sync posted first", postFirst: true, sync: true, src: 0, tag: 5, ctx: 2, wantMatch: true},
		{name: "sync unexpected first", sync: true, src: 0, tag: 5, ctx: 2, wantMatch: true},
		{name: "other context", postFirst: true, src: 0, tag: 5, ctx: 3},
		{name: "other tag", src: 0, tag: 6, ctx: 2},
		{name: "claimed elsewhere", postFirst: true, src: 0, tag: 5, ctx: 2, claimed: true},
		{name: "claimed elsewhere, unexpected first", src: 0, tag: 5, ctx: 2, claimed: true},
		{name: "cancelled", postFirst: true, src: 0, tag: 5, ctx: 2, cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, devs, evs := openMatchRanks(t, 2)
			type result struct {
				env sdi.Envelope
				n   int
				err error
			}
			done := make(chan result, 1)
			r := &sdi.PostedRecv{ID: 1, Source: tc.src, Tag: tc.tag, Context: tc.ctx, Buf: make([]byte, 8),
				Done: func(env sdi.Envelope, n int, err error) { done <- result{env, n, err} }}
			if tc.claimed {
				r.Claim = new(sdi.Claim)
				r.Claim.TryClaim(1)
			}
			if tc.postFirst {
				if err := devs[1].PostRecv(r); err != nil {
					t.Fatal(err)
				}
			}
			if tc.cancel {
				if !devs[1].CancelRecv(r.ID) || devs[1].CancelRecv(r.ID) {
					t.Fatal("CancelRecv of the posted receive: want true once, then false")
				}
			}
			sent, err := devs[0].SendTagged(&sdi.TaggedMessage{Peer: 1, Tag: 5, Context: 2, Payload: []byte("hello"), Sync: tc.sync, Token: 7})
			if err != nil || sent == tc.sync {
				t.Fatalf("SendTagged: done=%v, %v; want done=%v and no error", sent, err, !tc.sync)
			}
			if !tc.postFirst {
				waitUnexpected(t, devs[1], 0)
				if err := devs[1].PostRecv(r); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.wantMatch {
				waitUnexpected(t, devs[1], 0)
				select {
				case got := <-done:
					t.Fatalf("receive completed with %+v; want it unmatched", got)
				case <-time.After(20 * time.Millisecond):
				}
				return
			}
			select {
			case got := <-done:
				want := result{env: sdi.Envelope{Source: 0, Tag: 5, Context: 2, Len: 5}, n: 5}
				if got != want || string(r.Buf[:got.n]) != "hello" {
					t.Fatalf("receive completed with %+v, %q; want %+v, %q", got, r.Buf[:got.n], want, "hello")
				}
			case <-time.After(time.Second):
				t.Fatal("receive not completed within a second")
			}
			if _, ok := devs[1].Probe(0, 5, 2); ok {
				t.Error("Probe still finds the message a receive took")
			}
			if tc.sync {
				if ev := nextEvent(t, evs[0]); ev != "send 7 done: <nil>" {
					t.Errorf("sender's Handler call %q; want the synchronous send's SendDone", ev)
				}
			}
		})
	}
}

// TestMatchFabricKill: Kill cuts a rank off both ways, as sditest.Fabric's
// Sever does, and leaves the others talking: the adi tests of lost peers
// rely on it.
func TestMatchFabricKill(t *testing.T) {
	f, devs, evs := openMatchRanks(t, 3)
	f.Kill(1)
	for _, tc := range []struct {
		rank int
		want []string
	}{
		{0, []string{"rank 1 down"}},
		{1, []string{"rank 0 down", "rank 2 down"}},
		{2, []string{"rank 1 down"}},
	} {
		var got []string
		for range tc.want {
			got = append(got, nextEvent(t, evs[tc.rank]))
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("rank %d's Handler calls %q; want %q", tc.rank, got, tc.want)
		}
	}
	for _, tc := range []struct{ from, to int }{{0, 1}, {1, 2}} {
		if _, err := devs[tc.from].Send(&sdi.Frame{Peer: sdi.Rank(tc.to), Payload: []byte("x")}); err == nil {
			t.Errorf("Send from rank %d to rank %d after Kill(1): no error", tc.from, tc.to)
		}
		if _, err := devs[tc.from].SendTagged(&sdi.TaggedMessage{Peer: sdi.Rank(tc.to)}); err == nil {
			t.Errorf("SendTagged from rank %d to rank %d after Kill(1): no error", tc.from, tc.to)
		}
	}
	if _, err := devs[0].Send(&sdi.Frame{Peer: 2, Payload: []byte("x")}); err != nil {
		t.Fatalf("Send from rank 0 to rank 2 after Kill(1): %v", err)
	}
	if ev := nextEvent(t, evs[2]); ev != "deliver from 0: x" {
		t.Errorf("rank 2's Handler call %q; want rank 0's frame", ev)
	}
}
