package plugin

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// testSegment is a segment in ordinary memory: the ring code does not care
// whether another process maps it.
func testSegment(t testing.TB, out, in int) []byte {
	t.Helper()
	mem := make([]byte, segmentSize(out, in))
	initSegment(mem, out, in)
	if err := checkSegment(mem, uint64(out), uint64(in)); err != nil {
		t.Fatal(err)
	}
	return mem
}

func TestCheckSegment(t *testing.T) {
	mem := testSegment(t, minRingBytes, minRingBytes)
	for _, tc := range []struct {
		name    string
		mem     []byte
		out, in uint64
		want    string
	}{
		{"short", mem[:100], minRingBytes, minRingBytes, "smaller than its header"},
		{"sizes differ from attach", mem, minRingBytes, 2 * minRingBytes, "disagree"},
		{"size of the file", mem[:len(mem)-1], minRingBytes, minRingBytes, "want"},
		{"magic", append([]byte{0}, mem[1:]...), minRingBytes, minRingBytes, "magic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkSegment(tc.mem, tc.out, tc.in); err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
	bad := testSegment(t, minRingBytes, minRingBytes)
	binary.LittleEndian.PutUint64(bad[16:], 3*minRingBytes)
	if err := checkSegment(bad, 3*minRingBytes, minRingBytes); err == nil {
		t.Fatal("accepted a ring size that is not a power of two")
	}
}

// TestRingWrapsInOrder pushes records of awkward sizes through a small ring
// many times around, the consumer on another goroutine, and checks every
// byte and the order.
func TestRingWrapsInOrder(t *testing.T) {
	mem := testSegment(t, minRingBytes, minRingBytes)
	out, _ := rings(mem)
	lim := limits{maxHeader: 64, maxPayload: out.maxRecord() - recordPrefix - 64, size: 1}
	rd := reader{r: out, lim: lim}
	const n = 5000
	size := func(i int) int { return (i * 7919) % (lim.maxPayload + 1) }
	done := make(chan error, 1)
	go func() {
		for i := 0; i < n; {
			rec, cur, ok, err := rd.next()
			if err != nil {
				done <- err
				return
			}
			if !ok {
				rd.sleep(0, 10*time.Millisecond, nil)
				continue
			}
			want := bytes.Repeat([]byte{byte(i)}, size(i))
			if rec.kind != kindFrame || len(rec.header) != 8 || binary.LittleEndian.Uint64(rec.header) != uint64(i) || !bytes.Equal(rec.payload, want) {
				done <- fmt.Errorf("record %d: kind %d header %x, payload of %d bytes intact %v", i, rec.kind, rec.header, len(rec.payload), bytes.Equal(rec.payload, want))
				return
			}
			out.release(cur)
			i++
		}
		done <- nil
	}()
	hdr := make([]byte, 8)
	for i := range n {
		binary.LittleEndian.PutUint64(hdr, uint64(i))
		payload := bytes.Repeat([]byte{byte(i)}, size(i))
		for !out.tryWrite(kindFrame, 0, 0, hdr, payload) {
			out.waitRoom(recordLen(8, len(payload)), 10*time.Millisecond)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("consumer stuck")
	}
}

// TestRingRejectsCorruption: a producer that breaks the layout makes the
// reader fail with ErrBadFrame, never panic or read out of bounds.
func TestRingRejectsCorruption(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(r *ring)
		want    string
	}{
		{"head beyond the ring", func(r *ring) { r.head.Store(r.size + 64) }, "not within"},
		{"head behind the reader", func(r *ring) { r.head.Store(^uint64(0)) }, "not within"},
		{"bad record", func(r *ring) { r.data[0] = 99; r.head.Store(64) }, "kind 99"},
		{"pad short of the end", func(r *ring) {
			putRecord(r.data, kindPad, 0, 0, nil, nil)
			binary.LittleEndian.PutUint32(r.data[4:], 32)
			r.head.Store(r.size)
		}, "pad record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := rings(testSegment(t, minRingBytes, minRingBytes))
			tc.corrupt(out)
			rd := reader{r: out, lim: testLimits}
			_, _, _, err := rd.next()
			if !errors.Is(err, sdi.ErrBadFrame) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("err = %v, want ErrBadFrame mentioning %q", err, tc.want)
			}
		})
	}
}

// TestRingFullAndOversized: the producer refuses what does not fit now and
// accepts it once the consumer releases.
func TestRingFullAndOversized(t *testing.T) {
	out, _ := rings(testSegment(t, minRingBytes, minRingBytes))
	big := make([]byte, out.maxRecord()-recordPrefix)
	if !out.tryWrite(kindFrame, 0, 0, nil, big) {
		t.Fatal("an empty ring refused its largest record")
	}
	if out.tryWrite(kindFrame, 0, 0, nil, big) {
		t.Log("two largest records fit exactly")
	}
	if out.tryWrite(kindFrame, 0, 0, nil, make([]byte, 16)) {
		t.Fatal("a full ring accepted a record")
	}
	rd := reader{r: out, lim: limits{maxHeader: 0, maxPayload: len(big), size: 1}}
	_, cur, ok, err := rd.next()
	if err != nil || !ok {
		t.Fatalf("next = %v, %v", ok, err)
	}
	out.release(cur)
	if !out.tryWrite(kindFrame, 0, 0, nil, make([]byte, 16)) {
		t.Fatal("no room after a release")
	}
}

// TestReleaserInOrder: frames completed out of order give their space back
// only when everything before them is done.
func TestReleaserInOrder(t *testing.T) {
	out, _ := rings(testSegment(t, minRingBytes, minRingBytes))
	rl := releaser{r: out}
	var seqs []uint64
	for i := 1; i <= 4; i++ {
		seqs = append(seqs, rl.add(uint64(i*100)))
	}
	steps := []struct {
		done     int
		wantTail uint64
	}{{2, 0}, {1, 0}, {0, 300}, {3, 400}}
	for _, s := range steps {
		rl.done(seqs[s.done])
		if got := out.tail.Load(); got != s.wantTail {
			t.Fatalf("after completing frame %d: tail %d, want %d", s.done, got, s.wantTail)
		}
	}
	// Concurrent completions in any order end with everything released.
	var wg sync.WaitGroup
	seqs = seqs[:0]
	for i := 1; i <= 100; i++ {
		seqs = append(seqs, rl.add(uint64(400+i*16)))
	}
	for i := len(seqs) - 1; i >= 0; i-- {
		wg.Go(func() { rl.done(seqs[i]) })
	}
	wg.Wait()
	if got := out.tail.Load(); got != 400+100*16 {
		t.Fatalf("tail %d after all completions, want %d", got, 400+100*16)
	}
}

func TestPlaneBytes(t *testing.T) {
	for _, tc := range []struct {
		name               string
		caps               sdi.Caps
		wantSize, wantMax  int
		wantEagerUnchanged bool
	}{
		{"small frames get the minimum", sdi.Caps{MaxHeader: 64, MaxEager: 100, MaxFrame: 1000}, 1 << 20, 1000, true},
		{"tcp", sdi.Caps{MaxHeader: 256, MaxEager: 64 << 10, MaxFrame: 1 << 20}, 8 << 20, 1 << 20, true},
		{"huge frames are cut to fit", sdi.Caps{MaxHeader: 256, MaxEager: 1 << 30, MaxFrame: 1 << 30}, maxPlaneBytes, maxPlaneBytes/2 - recordPrefix - 256, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size, c := planeBytes(tc.caps)
			if size != tc.wantSize || c.MaxFrame != tc.wantMax || (c.MaxEager == tc.caps.MaxEager) != tc.wantEagerUnchanged {
				t.Fatalf("planeBytes = %d, %+v", size, c)
			}
			if recordLen(c.MaxHeader, c.MaxFrame) > size/2 || c.MaxEager > c.MaxFrame {
				t.Fatalf("largest record %d does not fit half of %d", recordLen(c.MaxHeader, c.MaxFrame), size)
			}
		})
	}
}

func FuzzRingReader(f *testing.F) {
	f.Add([]byte{}, uint64(0))
	b := make([]byte, 64)
	putRecord(b, kindDeliver, 1, 0, []byte("h"), []byte("p"))
	f.Add(b, uint64(32))
	f.Fuzz(func(t *testing.T, data []byte, head uint64) {
		out, _ := rings(testSegment(t, minRingBytes, minRingBytes))
		copy(out.data, data)
		out.head.Store(head)
		rd := reader{r: out, lim: testLimits}
		for range 100 {
			_, cur, ok, err := rd.next()
			if err != nil || !ok {
				return
			}
			if cur > head {
				t.Fatalf("reader went past head: %d > %d", cur, head)
			}
		}
	})
}

// A reader or writer about to wait for the other side does not block in a
// system call while another goroutine waits for the processor (as the
// application does, computing on a rank bound to one CPU): it naps in the
// Go scheduler and returns, so that the other goroutine runs at once. A
// futex wait would have kept the processor until the runtime's monitor
// took it back.
func TestRingWaitsYieldToRunnable(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	mem := testSegment(t, minRingBytes, minRingBytes)
	out, in := rings(mem)
	rd := reader{r: out, lim: limits{maxHeader: 64, maxPayload: 64, size: 1}}
	for !in.tryWrite(kindFrame, 0, 0, nil, make([]byte, in.maxRecord()/2)) {
	}
	for _, tc := range []struct {
		name string
		wait func()
	}{
		{"reader on an empty ring", func() { rd.sleep(0, 0, nil) }},
		{"writer on a full ring", func() { in.waitRoom(in.maxRecord(), 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ran atomic.Bool
			returned := make(chan struct{})
			go func() {
				go func() { ran.Store(true) }()
				tc.wait() // without limit, and nobody ends it: only a nap returns
				close(returned)
			}()
			select {
			case <-returned:
			case <-time.After(10 * time.Second):
				t.Fatal("the wait blocked beside a runnable goroutine")
			}
			if !ran.Load() {
				t.Error("the runnable goroutine did not run during the wait")
			}
		})
	}
}
