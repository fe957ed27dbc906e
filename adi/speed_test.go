package adi_test

import (
	"bytes"

	"encoding/binary"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/multidevice"
)

// shmJob runs n ranks in this process over the shm subdevice alone, so
// waiting ranks poll it.
func shmJob(t testing.TB, n int) []*adi.Comm {
	ws := job(t, n, adi.WithPlugins(&multidevice.PluginsConfig{SubDevices: []multidevice.SubDeviceSpec{{Name: "shm", Enabled: true}}}))
	cs := make([]*adi.Comm, n)
	for i, w := range ws {
		cs[i] = w.Comm()
	}
	return cs
}

// TestShmOrderUnderPolling streams eager and rendezvous messages from two
// ranks to a third that receives with AnySource, so frames are delivered by
// polling receivers and by the progress goroutines in turn (run with
// -race). Per-source order and contents must hold.
func TestShmOrderUnderPolling(t *testing.T) {
	const msgs = 600
	cs := shmJob(t, 3)
	ctx := ctxT(t)
	size := func(src, i int) int { return (i*7919 + src*13) % (160 << 10) } // eager limit is 64 KiB
	payload := func(src, i int) []byte {
		b := make([]byte, max(8, size(src, i)))
		binary.LittleEndian.PutUint32(b, uint32(i))
		for j := 4; j < len(b); j++ {
			b[j] = byte(i + j + src)
		}
		return b
	}
	var wg sync.WaitGroup
	for src := 1; src <= 2; src++ {
		wg.Go(func() {
			for i := range msgs {
				if err := cs[src].Send(ctx, payload(src, i), 0, 3); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	next := []int{0, 0, 0}
	buf := make([]byte, 160<<10)
	for range 2 * msgs {
		st, err := cs[0].Recv(ctx, buf, adi.AnySource, 3)
		if err != nil {
			t.Fatal(err)
		}
		i := int(binary.LittleEndian.Uint32(buf))
		if i != next[st.Source] {
			t.Fatalf("from rank %d: message %d arrived, expected %d", st.Source, i, next[st.Source])
		}
		if !bytes.Equal(buf[:st.Count], payload(st.Source, i)) {
			t.Fatalf("from rank %d: message %d differs", st.Source, i)
		}
		next[st.Source]++
	}
	wg.Wait()
}

// TestIdleRecvUsesNoCPU blocks a rank in Recv for about two seconds and
// checks that the process used under 2 % of one core meanwhile: the waiter
// polls only briefly, then parks, and the shm progress goroutine sleeps on
// its futex. The figure is asserted, not a duration.
func TestIdleRecvUsesNoCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("takes two seconds")
	}
	cs := shmJob(t, 2)
	ctx := ctxT(t)
	got := make(chan error, 1)
	go func() {
		_, err := cs[1].Recv(ctx, make([]byte, 8), 0, 9)
		got <- err
	}()
	time.Sleep(100 * time.Millisecond) // past the spin budget and the handover to futex sleeps
	const idle = 2 * time.Second
	cpu0, wall0 := cpuTime(t), time.Now()
	time.Sleep(idle)
	cpu, wall := cpuTime(t)-cpu0, time.Since(wall0)
	if err := cs[0].Send(ctx, make([]byte, 8), 1, 9); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	share := float64(cpu) / float64(wall)
	t.Logf("a rank blocked in Recv for %v: process used %v of CPU (%.3f %% of a core)", wall.Round(time.Millisecond), cpu, 100*share)
	if share >= 0.02 {
		t.Fatalf("idle rank used %.2f %% of a core, want < 2 %%", 100*share)
	}
}

// cpuTime is the user plus system time this process has used so far.
func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
