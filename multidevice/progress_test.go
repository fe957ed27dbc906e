package multidevice

import (
	"context"
	"runtime"
	"testing"

	"github.com/hpc-multidevice/multidevice/internal/sched"
)

// A host is crowded for a rank when more polling threads may run on its
// CPUs than there are, whatever each rank's own view of the machine.
func TestCrowded(t *testing.T) {
	both := sched.CPUs(0, 1)
	tests := []struct {
		name     string
		local    []sched.CPUSet
		mine     int
		perRank  int
		hostCPUs int
		want     bool
		threads  int
		cpus     int
	}{
		{"two unbound ranks, two CPUs", []sched.CPUSet{both, both}, 0, 1, 2, false, 2, 2},
		{"four unbound ranks, two CPUs", []sched.CPUSet{both, both, both, both}, 1, 1, 2, true, 4, 2},
		// Each sees one CPU (and so does runtime.NumCPU): not crowded.
		{"bound to a core each", []sched.CPUSet{sched.CPUs(0), sched.CPUs(1)}, 0, 1, 1, false, 1, 1},
		{"bound to one core together", []sched.CPUSet{sched.CPUs(0), sched.CPUs(0)}, 1, 1, 1, true, 2, 1},
		{"alone on its core", []sched.CPUSet{sched.CPUs(0), sched.CPUs(0), sched.CPUs(1)}, 2, 1, 1, false, 1, 1},
		{"sharing a core beside one alone", []sched.CPUSet{sched.CPUs(0), sched.CPUs(0), sched.CPUs(1)}, 0, 1, 1, true, 2, 1},
		{"bound, with a polling plugin each", []sched.CPUSet{sched.CPUs(0), sched.CPUs(1)}, 0, 2, 1, true, 2, 1},
		{"overlapping bindings", []sched.CPUSet{sched.CPUs(0, 1), sched.CPUs(1, 2), sched.CPUs(3)}, 0, 1, 1, false, 2, 3},
		{"CPUs beyond 64", []sched.CPUSet{sched.CPUs(70), sched.CPUs(70)}, 0, 1, 1, true, 2, 1},
		{"one unknown, roomy host", []sched.CPUSet{sched.CPUs(0), nil}, 0, 1, 4, false, 2, 4},
		{"one unknown, small host", []sched.CPUSet{sched.CPUs(0), nil}, 0, 1, 1, true, 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, threads, cpus := crowded(tt.local, tt.mine, tt.perRank, tt.hostCPUs)
			if got != tt.want || threads != tt.threads || cpus != tt.cpus {
				t.Errorf("crowded = %v, %d threads on %d CPUs; want %v, %d on %d", got, threads, cpus, tt.want, tt.threads, tt.cpus)
			}
		})
	}
}

// Ranks publish their CPUs and read those of the ranks on their host as
// they open: ranks sharing this process see its CPUs each.
func TestCrowdedFromJob(t *testing.T) {
	cpus, err := sched.Affinity()
	if err != nil {
		t.Skipf("no CPU affinity here: %v", err)
	}
	for _, n := range []int{1, 2, 3} {
		devs := loopJob(t, n, smallCaps)
		want := n > cpus.Count()
		for _, d := range devs {
			b, err := d.boot.Get(context.Background(), n-1, "cpus")
			if got, derr := sched.DecodeCPUSet(b); err != nil || derr != nil || got.String() != cpus.String() {
				t.Errorf("rank %d reads rank %d's CPUs as %v (%v, %v), want %v", d.rank, n-1, got, err, derr, cpus)
			}
			if d.prog.crowded != want {
				t.Errorf("%d ranks on %v (%d CPUs, runtime.NumCPU %d): crowded = %v, want %v", n, cpus, cpus.Count(), runtime.NumCPU(), d.prog.crowded, want)
			}
		}
		closeJob(t, devs)
	}
}

// A waiter counts as a spinner, which keeps the outbox goroutine asleep
// and costs two locked instructions, only once its wait lasted
// spinCheckEvery rounds after the first or a round after the first
// handled something; it stops counting when the wait ends.
func TestSpinnerCounted(t *testing.T) {
	tests := []struct {
		name   string
		arrive int // polls before the one that ends the wait
		frames int // the first polls each handle a frame that does not end it
		from   int // the round at whose end the waiter counts from; -1: never
	}{
		{"first round", 0, 0, -1},
		{"a few quiet rounds", 4, 0, -1},
		{"just short of the check", spinCheckEvery, 0, -1},
		{"long quiet wait", 3 * spinCheckEvery, 0, spinCheckEvery},
		{"a frame in the first round", 6, 1, -1},
		{"frames flowing", 6, 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := loopJob(t, 1, smallCaps)[0]
			p := &scriptPoller{arrive: tt.arrive, frames: tt.frames}
			p.check = func(poll int) { // poll k is made in round k-1
				counted := d.prog.spinners.Load() != 0
				if want := tt.from >= 0 && poll-1 > tt.from; counted != want {
					t.Errorf("round %d: counted as a spinner %v, want %v", poll-1, counted, want)
				}
			}
			if !d.spin([]*polled{{p: p}}, func() bool { return p.arrive < 0 }) {
				t.Skip("the wait outlasted the spin budget: this goroutine was descheduled for long")
			}
			if n := d.prog.spinners.Load(); n != 0 {
				t.Errorf("%d spinners after the wait ended", n)
			}
		})
	}
}

// scriptPoller handles a frame in each of its first frames polls, then
// nothing until arrive polls have passed, when it handles the one that
// ends the wait (arrive then becomes -1). check sees each poll first.
type scriptPoller struct {
	arrive, frames, polls int
	check                 func(poll int)
}

func (p *scriptPoller) Poll() int {
	p.polls++
	p.check(p.polls)
	switch {
	case p.arrive >= 0 && p.polls > p.arrive:
		p.arrive = -1
		return 1
	case p.polls <= p.frames:
		return 1
	}
	return 0
}
