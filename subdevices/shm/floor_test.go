package shm

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/internal/sched"
)

// floorEnv makes the test binary the second process of BenchmarkRingFloor:
// "slots iterations".
const floorEnv = "MDSHM_FLOOR_CHILD"

// BenchmarkRingFloor measures the floor under this subdevice's small
// message latency on this machine: two processes bound to CPUs 0 and 1
// send a 64-byte record back and forth through rings in shared memory,
// each record published by its stamp as the subdevice's are (stamp and
// published in ring.go), with nothing else done per message. ns/halfRT is
// comparable with the direct series of `mdbench --direct --sizes 8 lat`;
// what lies between the two is the subdevice's own work per frame.
//
// The variants differ in how many cache lines a ring has: the
// subdevice's default ring walks through 16384 before it comes back to
// one, where an implementation that keeps small messages in a few lines
// reuses them while they are still in both cores' caches:
//
//	go test -run '^$' -bench RingFloor ./subdevices/shm
func BenchmarkRingFloor(b *testing.B) {
	if runtime.NumCPU() < 2 {
		b.Skip("needs 2 CPUs, one per process")
	}
	for _, slots := range []int{2, 64, defaultRingBytes / recAlign} {
		b.Run(fmt.Sprintf("lines=%d", slots), func(b *testing.B) { benchRingFloor(b, slots) })
	}
}

func benchRingFloor(b *testing.B, slots int) {
	fd, err := unix.MemfdCreate("mdshm-floor", unix.MFD_CLOEXEC)
	if err != nil {
		b.Skipf("memfd_create: %v", err)
	}
	f := os.NewFile(uintptr(fd), "mdshm-floor")
	defer f.Close()
	out, in, unmap, err := mapFloorRings(f, slots, true)
	if err != nil {
		b.Fatal(err)
	}
	defer unmap()

	unpin, err := sched.PinThread(0)
	if err != nil {
		b.Fatal(err)
	}
	defer unpin()

	// The first warm rounds fault the rings' pages in and let both
	// processes settle on their CPUs; they are not timed.
	warm := min(slots, 1<<14) + 1000
	n := b.N
	cmd := exec.Command(os.Args[0], "-test.run=^TestFloorHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %d", floorEnv, slots, warm+n))
	cmd.ExtraFiles = []*os.File{f} // fd 3 in the child
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var rec [recAlign - stampBytes]byte
	var seq uint64
	round := func() bool {
		floorSend(out, seq, rec[:])
		ok := floorRecv(in, seq, rec[:])
		seq++
		return ok
	}
	ok := true
	for i := 0; ok && i < warm; i++ {
		ok = round()
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; ok && i < n; i++ {
		ok = round()
	}
	el := time.Since(start)
	b.StopTimer()
	if !ok {
		_ = cmd.Process.Kill()
	}
	if err := cmd.Wait(); err != nil || !ok {
		b.Fatalf("second process: no record for %v (exit: %v)", floorPatience, err)
	}
	b.ReportMetric(float64(el.Nanoseconds())/float64(2*n), "ns/halfRT")
}

// TestFloorHelper is BenchmarkRingFloor's second process; it does nothing
// in a normal test run.
func TestFloorHelper(t *testing.T) {
	arg := os.Getenv(floorEnv)
	if arg == "" {
		t.Skip("second process of BenchmarkRingFloor")
	}
	// Exit explicitly, as TestHelperProcess does: the framework's own
	// output would only get in the way.
	os.Exit(runFloorChild(arg))
}

func runFloorChild(arg string) int {
	var slots, n int
	if _, err := fmt.Sscan(arg, &slots, &n); err != nil || slots <= 0 || n <= 0 {
		fmt.Fprintf(os.Stderr, "floor child: bad %s=%q\n", floorEnv, arg)
		return 2
	}
	out, in, unmap, err := mapFloorRings(os.NewFile(3, "mdshm-floor"), slots, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, "floor child:", err)
		return 1
	}
	defer unmap()
	if _, err := sched.PinThread(1); err != nil { // until the process exits
		fmt.Fprintln(os.Stderr, "floor child:", err)
		return 1
	}
	var rec [recAlign - stampBytes]byte
	for seq := range uint64(n) {
		if !floorRecv(in, seq, rec[:]) {
			fmt.Fprintf(os.Stderr, "floor child: no record %d for %v\n", seq, floorPatience)
			return 1
		}
		floorSend(out, seq, rec[:])
	}
	return 0
}

// mapFloorRings maps two rings of slots records each from f, sizing it
// first when create is set, and returns the one this process writes and
// the one it reads.
func mapFloorRings(f *os.File, slots int, create bool) (out, in []byte, unmap func(), err error) {
	ring := slots * recAlign
	size := 2 * ring
	if create {
		if err := f.Truncate(int64(size)); err != nil {
			return nil, nil, nil, err
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("mmap: %w", err)
	}
	a, b := mem[:ring:ring], mem[ring:]
	if !create {
		a, b = b, a
	}
	return a, b, func() { _ = unix.Munmap(mem) }, nil
}

// floorSend writes the record for message seq, body then stamp.
func floorSend(ring []byte, seq uint64, body []byte) {
	cursor := seq * recAlign
	off := cursor & uint64(len(ring)-1)
	copy(ring[off+stampBytes:], body)
	stamp(ring, cursor)
}

// floorRecv waits for the record of message seq and copies its body out.
// It gives up, reporting false, when the other process has not written
// it within floorPatience: that one died or never started.
func floorRecv(ring []byte, seq uint64, body []byte) bool {
	cursor := seq * recAlign
	for i := 1; !published(ring, cursor); i++ {
		if i%(1<<20) == 0 && !floorWait(i) {
			return false
		}
	}
	off := cursor & uint64(len(ring)-1)
	copy(body, ring[off+stampBytes:])
	return true
}

// floorPatience bounds a wait for the other process's next record.
const floorPatience = 10 * time.Second

// floorStart is when the current long wait began; only the waiting loop
// of one goroutine per process uses it.
var floorStart time.Time

// floorWait reports whether a wait that has polled i times may go on.
func floorWait(i int) bool {
	if i == 1<<20 {
		floorStart = time.Now()
		return true
	}
	return time.Since(floorStart) < floorPatience
}
