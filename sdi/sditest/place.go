package sditest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Checks of sdi.Placer: in them the suite's Handler implements Placer, as
// the multidevice's does, so a subdevice that writes payloads straight into
// the Handler's buffers is held to the Place rules. Place hands out a place
// for two frames in three and nil for the rest, so both ways of delivering
// alternate within one peer's frames. A place is filled with junk when it is
// given, so one delivered before it was filled fails the payload check; once
// it is delivered or ended (PeerDown of its peer, a Close that returned
// nil) the suite writes a canary into it, so a subdevice that writes into it
// afterwards is caught when the canary is checked.

// frameKey names one frame of the suite at its receiver.
type frameKey struct {
	from   sdi.Rank
	stream uint16
	seq    uint64
}

// place is a slice Place handed out, and what became of it.
type place struct {
	key       frameKey
	buf       []byte
	delivered bool   // Deliver came, in this place or (a violation) elsewhere
	ended     string // what ended it unfilled: "PeerDown(1)", "Close returned nil"
	canary    bool   // buf holds the canary: nothing may write into it now
	checked   bool   // a violation was reported for it
}

func (k frameKey) canarySeed() uint64 {
	return uint64(k.from)<<48 ^ uint64(k.stream)<<32 ^ k.seq ^ 0xc0ffee
}

func (p *place) setCanary() {
	pattern(p.buf, p.key.canarySeed())
	p.canary = true
}

// placingRecorder is a recorder that also implements sdi.Placer; instances
// opened while env.placing is set get it as their Handler.
type placingRecorder struct{ *recorder }

// handler is what the instance of r gets as OpenParams.Handler.
func (r *recorder) handler() sdi.Handler {
	if r.e.placing {
		return placingRecorder{r}
	}
	return r
}

// junk fills a place when it is handed out; a payload delivered from a
// place the subdevice did not fill does not match its pattern.
const junk = 0xee

func (r placingRecorder) Place(from sdi.Rank, header []byte, n int) []byte {
	e := r.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.closed {
		e.violateLocked("rank %d: Place from rank %d after Close returned", r.rank, from)
	}
	if r.inDeliver[from] {
		e.violateLocked("rank %d: Place for a frame from rank %d during a Deliver from it; Place is called where Deliver would be, serialized per peer", r.rank, from)
	}
	m, plen, problem := decodeHeader(r.rank, from, header)
	if problem != "" {
		e.violateLocked("rank %d: Place from rank %d: %s", r.rank, from, problem)
		return nil
	}
	if plen != n {
		e.violateLocked("rank %d: Place from rank %d for stream %d seq %d asks for %d bytes; the frame carries %d payload bytes", r.rank, from, m.stream, m.seq, n, plen)
		return nil
	}
	key := frameKey{from, m.stream, m.seq}
	if p := r.places[key]; p != nil && !p.delivered && p.ended == "" {
		e.violateLocked("rank %d: Place from rank %d again for stream %d seq %d, which has a place not yet delivered", r.rank, from, m.stream, m.seq)
		return nil
	}
	e.placeAsks++
	if n == 0 || m.seq%3 == 2 {
		return nil
	}
	buf := make([]byte, n)
	for i := range buf {
		buf[i] = junk
	}
	r.places[key] = &place{key: key, buf: buf}
	return buf
}

// placeOfLocked returns the place of the frame Deliver hands over, when it
// is delivered in its place, and reports a placed frame delivered any other
// way.
func (r *recorder) placeOfLocked(from sdi.Rank, header, payload []byte) *place {
	if len(r.places) == 0 {
		return nil
	}
	m, _, problem := decodeHeader(r.rank, from, header)
	if problem != "" {
		return nil // Deliver reports it
	}
	p := r.places[frameKey{from, m.stream, m.seq}]
	switch {
	case p == nil || p.delivered:
		return nil // not placed, or a duplicate, which Deliver reports
	case p.ended != "":
		r.e.violateLocked("rank %d: Deliver from rank %d of stream %d seq %d, whose place ended with %s; a subdevice delivers none of those frames", r.rank, from, m.stream, m.seq, p.ended)
		return nil
	case len(payload) != len(p.buf) || unsafe.SliceData(payload) != unsafe.SliceData(p.buf):
		p.delivered = true
		r.e.violateLocked("rank %d: Deliver from rank %d of stream %d seq %d not in the place Place returned for it; a placed frame is delivered in that slice (same first element and length), or its peer reported down", r.rank, from, m.stream, m.seq)
		return nil
	}
	return p
}

// deliveredLocked marks p delivered: from now on the subdevice writes
// nothing into it.
func (p *place) deliveredLocked() {
	p.delivered = true
	p.setCanary()
}

// endPlaces ends r's places for frames from peer (every peer when peer
// is negative) that were neither delivered nor ended yet.
func (r *recorder) endPlaces(peer sdi.Rank, why string) {
	r.e.mu.Lock()
	defer r.e.mu.Unlock()
	r.endPlacesLocked(peer, why)
}

func (r *recorder) endPlacesLocked(peer sdi.Rank, why string) {
	for _, p := range r.places {
		if p.delivered || p.ended != "" || (peer >= 0 && p.key.from != peer) {
			continue
		}
		p.ended = why
		p.setCanary()
	}
}

// checkPlaces reports places the subdevice wrote into after they were
// delivered or ended and, when outstanding is set, places given for frames
// that every rank should have by now and that were neither delivered nor
// ended.
func (e *env) checkPlaces(outstanding bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.recs {
		for _, p := range r.places {
			if outstanding && !p.delivered && p.ended == "" && !p.checked {
				e.violateLocked("rank %d: Place gave a place for stream %d seq %d from rank %d, which was neither filled and delivered nor ended by PeerDown", r.rank, p.key.stream, p.key.seq, p.key.from)
				p.checked = true
			}
			if !p.canary || p.checked {
				continue
			}
			if i := mismatch(p.buf, p.key.canarySeed()); i >= 0 {
				why := "after delivering it"
				if p.ended != "" {
					why = "after " + p.ended
				}
				e.violateLocked("rank %d: the subdevice wrote into the place of stream %d seq %d from rank %d %s (byte %d of %d)", r.rank, p.key.stream, p.key.seq, p.key.from, why, i, len(p.buf))
				p.checked = true
			}
		}
	}
}

// checkEndedPlaces gives a subdevice that still writes into places ended
// by Close the time to show it, then checks every canary.
func (e *env) checkEndedPlaces() {
	e.mu.Lock()
	var ended bool
	for _, r := range e.recs {
		for _, p := range r.places {
			ended = ended || p.ended != ""
		}
	}
	e.mu.Unlock()
	if ended {
		time.Sleep(e.tm.quiet)
	}
	e.checkPlaces(false)
}

func testPlaceDelivers(t testing.TB, e *env) {
	e.placing = true
	e.open(t)
	e.connectAll(t)
	// As Concurrent/Sends, with fewer goroutines.
	e.allToAllStreams(t, 2, count(100))
	e.awaitCompletions(t)
	time.Sleep(e.tm.quiet) // late writes into delivered places show in their canaries
	e.checkPlaces(true)
	e.mu.Lock()
	asks, placed := e.placeAsks, 0
	for _, r := range e.recs {
		placed += len(r.places)
	}
	e.mu.Unlock()
	if asks == 0 {
		t.Log("the subdevice never called Place: it delivers every frame from buffers of its own, which the contract allows")
		return
	}
	t.Logf("Place was called for %d frames, %d of them got a place", asks, placed)
}

func testPlaceEndedByPeerDown(t testing.TB, e *env) {
	e.placing = true
	e.open(t)
	e.connectAll(t)
	// Rank 1 floods rank 0 with the largest frames from two goroutines and
	// is closed meanwhile, so that frames are likely half-filled into their
	// places when it goes.
	var stop atomic.Bool
	var wg sync.WaitGroup
	defer func() { stop.Store(true); wg.Wait() }() // also on t.Fatal
	for g := range 2 {
		wg.Go(func() {
			for seq := 0; !stop.Load(); seq++ {
				m := msg{from: 1, to: 0, stream: uint16(g + 1), seq: uint64(seq), size: e.caps.MaxFrame}
				if _, err := e.send(1, e.frame(m)); err != nil {
					return // ErrClosed once rank 1 is closed
				}
			}
		})
	}
	e.awaitStream(t, 0, 1, 1, 2)
	// A placing subdevice gets a moment to ask for places of a few more
	// frames, so that some are likely being filled at the Close; one that
	// never asks costs only the moment.
	_ = e.awaitFor(e.tm.quiet, func() (bool, string) { return e.placeAsks >= 8, "8 Place calls" })
	err := e.closeRank(1)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatalf("rank 1: Close: %v", err)
	}
	// A place is filled and delivered, or its peer reported down: a
	// subdevice that cannot fill one says so, or the receive it stands for
	// waits forever.
	err = e.awaitFor(e.tm.patience, func() (bool, string) {
		var open []uint64
		for _, p := range e.recs[0].places {
			if !p.delivered && p.ended == "" {
				open = append(open, p.key.seq)
			}
		}
		return len(open) == 0, fmt.Sprintf("rank 0 to fill and deliver, or end by PeerDown(1), the places of %d frames of the closed rank 1 (seq %v)", len(open), open[:min(len(open), 5)])
	})
	if err != nil {
		t.Errorf("places given for frames of a closed peer were neither filled and delivered nor ended by PeerDown: %v", err)
	}
	time.Sleep(e.tm.quiet) // late writes into ended places show in their canaries
	e.checkPlaces(false)
	e.mu.Lock()
	var ended int
	for _, p := range e.recs[0].places {
		if p.ended != "" {
			ended++
		}
	}
	placed := len(e.recs[0].places)
	e.mu.Unlock()
	t.Logf("rank 0 gave %d places for rank 1's frames; %d of them ended with PeerDown unfilled", placed, ended)
}
