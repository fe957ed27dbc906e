//go:build linux

package plugin_test

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/internal/futex"
	"github.com/hpc-multidevice/multidevice/internal/sched"
)

// BenchmarkHandoff measures what a message pays for each process boundary
// it crosses on this machine: two processes hand a turn back and forth
// through a word in shared memory, bound to one CPU or to two, waiting by
// spinning with sched_yield, by spinning alone, or on a futex. A plugin
// subdevice puts two such crossings on a message's way (rank to plugin,
// plugin to rank), so with fewer CPUs than polling threads its latency
// over the built-in subdevice is at least two "one-cpu" hand-offs:
//
//	go test -run '^$' -bench Handoff ./sdi/plugin
func BenchmarkHandoff(b *testing.B) {
	for _, m := range []struct {
		name   string
		mode   handoffMode
		child  int // the child's CPU; the parent takes CPU 0
		enough int // CPUs the case needs
	}{
		{"yield-one-cpu", handoffYield, 0, 1},
		{"futex-one-cpu", handoffFutex, 0, 1},
		{"spin-two-cpus", handoffSpin, 1, 2},
		{"futex-two-cpus", handoffFutex, 1, 2},
	} {
		b.Run(m.name, func(b *testing.B) {
			if runtime.NumCPU() < m.enough {
				b.Skipf("needs %d CPUs", m.enough)
			}
			benchHandoff(b, m.mode, m.child)
		})
	}
}

type handoffMode int

const (
	handoffSpin handoffMode = iota
	handoffYield
	handoffFutex
)

// handoffArg makes the test binary the benchmark's second process.
const handoffArg = "-handoff-child"

func benchHandoff(b *testing.B, mode handoffMode, childCPU int) {
	f, err := os.CreateTemp("/dev/shm", "mdsdi-handoff-")
	if err != nil {
		b.Skipf("no /dev/shm: %v", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	turn, unmap, err := mapTurn(f)
	if err != nil {
		b.Fatal(err)
	}
	defer unmap()

	unpin, err := sched.PinThread(0)
	if err != nil {
		b.Fatal(err)
	}
	defer unpin()

	n := b.N
	cmd := exec.Command(os.Args[0], handoffArg, f.Name(), strconv.Itoa(int(mode)), strconv.Itoa(childCPU), strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	// The child says it is ready by taking the first turn.
	waitTurn(turn, 1, handoffYield)
	b.ResetTimer()
	start := time.Now()
	for i := range n {
		passTurn(turn, uint32(2*i+2), mode)
		waitTurn(turn, uint32(2*i+3), mode)
	}
	el := time.Since(start)
	b.StopTimer()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("child: %v", err)
	}
	b.ReportMetric(float64(el.Nanoseconds())/float64(2*n), "ns/handoff")
}

// handoffChild is the second process: it takes turns 1, 3, 5, ...
func handoffChild(args []string) int {
	if len(args) != 4 {
		fmt.Fprintln(os.Stderr, "handoff child: want path, mode, cpu, iterations")
		return 2
	}
	mode, _ := strconv.Atoi(args[1])
	cpu, _ := strconv.Atoi(args[2])
	n, _ := strconv.Atoi(args[3])
	f, err := os.OpenFile(args[0], os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	turn, unmap, err := mapTurn(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer unmap()
	if _, err := sched.PinThread(cpu); err != nil { // until the process exits
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	passTurn(turn, 1, handoffYield)
	for i := range n {
		waitTurn(turn, uint32(2*i+2), handoffMode(mode))
		passTurn(turn, uint32(2*i+3), handoffMode(mode))
	}
	return 0
}

// mapTurn maps the turn word, the first word of f, which it sizes.
func mapTurn(f *os.File) (*atomic.Uint32, func(), error) {
	if err := f.Truncate(4096); err != nil {
		return nil, nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap %s: %w", f.Name(), err)
	}
	return (*atomic.Uint32)(unsafe.Pointer(&mem[0])), func() { _ = unix.Munmap(mem) }, nil
}

func passTurn(turn *atomic.Uint32, v uint32, mode handoffMode) {
	turn.Store(v)
	if mode == handoffFutex {
		_, _ = futex.Wake((*uint32)(unsafe.Pointer(turn)), 1)
	}
}

func waitTurn(turn *atomic.Uint32, want uint32, mode handoffMode) {
	for {
		v := turn.Load()
		if v == want {
			return
		}
		switch mode {
		case handoffYield:
			sched.Yield()
		case handoffFutex:
			_ = futex.Wait((*uint32)(unsafe.Pointer(turn)), v, time.Second)
		}
	}
}
