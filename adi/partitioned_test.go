package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/internal/leakcheck"
)

// partByte is byte o of a partitioned message in round r: different in
// every round, so that a partition reported arrived that still holds an
// earlier round's bytes is caught.
func partByte(r, o int) byte { return byte(o*7 + r*13 + 1) }

func fillPart(b []byte, r, off int) {
	for i := range b {
		b[i] = partByte(r, off+i)
	}
}

func checkPart(b []byte, r, off int) error {
	for i := range b {
		if b[i] != partByte(r, off+i) {
			return fmt.Errorf("round %d: byte %d = %d, want %d", r, off+i, b[i], partByte(r, off+i))
		}
	}
	return nil
}

// both runs the sender and the receiver of a test at once and fails t
// with their errors.
func both(t *testing.T, send, recv func() error) {
	t.Helper()
	var wg sync.WaitGroup
	var serr, rerr error
	wg.Go(func() { serr = send() })
	wg.Go(func() { rerr = recv() })
	wg.Wait()
	if serr != nil {
		t.Errorf("sender: %v", serr)
	}
	if rerr != nil {
		t.Errorf("receiver: %v", rerr)
	}
}

// TestPartitioned: rounds of a partitioned message, its partitions
// filled and readied out of order by several goroutines at once (one at
// a time, as lists, as a range), arrive whole, each receiver partition
// correct as soon as Parrived says it came, with sender and receiver
// cutting the buffer alike or not, below and above the loop fabric's
// eager limit (512 bytes), between two ranks and to self.
func TestPartitioned(t *testing.T) {
	cases := []struct {
		name         string
		sends, recvs int
		length       int
		self         bool
	}{
		{"4to4/eager", 4, 4, 4 * 100, false},
		{"4to4/rendezvous", 4, 4, 4 * 700, false},
		{"4to2/eager", 4, 2, 4 * 64, false},
		{"4to2/rendezvous", 4, 2, 4 * 600, false},
		{"3to6/eager", 3, 6, 6 * 50, false},
		{"3to6/rendezvous", 3, 6, 6 * 300, false},
		{"1to5/eager", 1, 5, 5 * 80, false},
		{"1to5/rendezvous", 1, 5, 5 * 300, false},
		{"5to1/rendezvous", 5, 1, 5 * 600, false},
		{"8to3/mixed", 8, 3, 24 * 100, false}, // 300-byte sends, 800-byte receives
		{"2to3/empty", 2, 3, 0, false},
		{"self/4to2/rendezvous", 4, 2, 4 * 600, true},
		{"self/3to6/eager", 3, 6, 6 * 20, true},
	}
	const rounds, workers, tag = 4, 3, 5
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			to := 1
			if tc.self {
				to = 0
			}
			sl, rl := tc.length/tc.sends, tc.length/tc.recvs
			send := func() error {
				buf := make([]byte, tc.length)
				ps, err := cs[0].PsendInit(buf, tc.sends, to, tag)
				if err != nil {
					return err
				}
				for r := range rounds {
					if err := ps.Start(); err != nil {
						return err
					}
					// Each worker fills and readies its partitions, last first.
					errs := make([]error, workers)
					var wg sync.WaitGroup
					for g := range workers {
						wg.Go(func() {
							var mine []int
							for i := tc.sends - 1 - g; i >= 0; i -= workers {
								fillPart(buf[i*sl:(i+1)*sl], r, i*sl)
								mine = append(mine, i)
							}
							switch {
							case r%3 == 1:
								errs[g] = ps.PreadyList(mine)
							case r%3 == 2 && len(mine) > 0:
								// Only this worker's partitions, which are not a range:
								// one at a time through PreadyRange.
								for _, i := range mine {
									if err := ps.PreadyRange(i, i); err != nil {
										errs[g] = err
									}
								}
							default:
								for _, i := range mine {
									if err := ps.Pready(i); err != nil {
										errs[g] = err
									}
								}
							}
						})
					}
					wg.Wait()
					if err := errors.Join(errs...); err != nil {
						return fmt.Errorf("round %d: %w", r, err)
					}
					if _, err := ps.Wait(ctx); err != nil {
						return fmt.Errorf("round %d: %w", r, err)
					}
				}
				return nil
			}
			recv := func() error {
				buf := make([]byte, tc.length)
				pr, err := cs[to].PrecvInit(buf, tc.recvs, 0, tag)
				if err != nil {
					return err
				}
				for r := range rounds {
					if err := adi.StartAll(pr); err != nil {
						return err
					}
					seen := make([]bool, tc.recvs)
					for left := tc.recvs; left > 0; {
						for j := range seen {
							if seen[j] {
								continue
							}
							ok, err := pr.Parrived(j)
							if err != nil {
								return fmt.Errorf("round %d: %w", r, err)
							}
							if ok {
								if err := checkPart(buf[j*rl:(j+1)*rl], r, j*rl); err != nil {
									return fmt.Errorf("partition %d reported arrived: %w", j, err)
								}
								seen[j] = true
								left--
							}
						}
						if ctx.Err() != nil {
							return fmt.Errorf("round %d: partitions arrived: %v: %w", r, seen, ctx.Err())
						}
						runtime.Gosched()
					}
					var st adi.Status
					if r%2 == 0 {
						_, st, err = adi.WaitAny(ctx, nil, pr)
					} else {
						var sts []adi.Status
						sts, err = adi.WaitAll(ctx, pr)
						st = sts[0]
					}
					if err != nil {
						return fmt.Errorf("round %d: %w", r, err)
					}
					if st.Source != 0 || st.Tag != tag || st.Count != tc.length {
						return fmt.Errorf("round %d: status %+v", r, st)
					}
					if err := checkPart(buf, r, 0); err != nil {
						return err
					}
				}
				return nil
			}
			both(t, send, recv)
		})
	}
}

// TestPartitionedTrickle: the receiver sees each partition arrive as the
// sender readies it, and no partition before it is readied, while the
// two talk with ordinary messages of the same tag on the same
// communicator; the rounds complete only with their last partition.
func TestPartitionedTrickle(t *testing.T) {
	cases := []struct {
		sends, recvs, length int
	}{
		{4, 2, 4 * 600},
		{3, 6, 6 * 10},
		{2, 2, 2 * 700},
		{2, 3, 6 * 200},
	}
	const tag = 0
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%dto%d/%d", tc.sends, tc.recvs, tc.length), func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			sl, rl := tc.length/tc.sends, tc.length/tc.recvs
			ack := make([]byte, 1)
			send := func() error {
				buf := make([]byte, tc.length)
				ps, err := cs[0].PsendInit(buf, tc.sends, 1, tag)
				if err != nil {
					return err
				}
				for r := range 2 {
					if err := ps.Start(); err != nil {
						return err
					}
					for i := range tc.sends {
						if _, done, _ := ps.Test(); done {
							return fmt.Errorf("round %d: send complete with %d of %d partitions readied", r, i, tc.sends)
						}
						fillPart(buf[i*sl:(i+1)*sl], r, i*sl)
						if err := ps.Pready(i); err != nil {
							return err
						}
						if _, err := cs[0].Recv(ctx, ack, 1, tag); err != nil {
							return err
						}
						if int(ack[0]) != i {
							return fmt.Errorf("round %d: ack %d, want %d", r, ack[0], i)
						}
					}
					if _, err := ps.Wait(ctx); err != nil {
						return err
					}
				}
				return nil
			}
			recv := func() error {
				buf := make([]byte, tc.length)
				pr, err := cs[1].PrecvInit(buf, tc.recvs, 0, tag)
				if err != nil {
					return err
				}
				for r := range 2 {
					if err := pr.Start(); err != nil {
						return err
					}
					for i := range tc.sends {
						// Sender partitions 0..i are readied: the receiver
						// partitions they cover come, the others cannot.
						for j := range tc.recvs {
							covered := (j+1)*rl <= (i+1)*sl
							ok, err := pr.Parrived(j)
							for covered && !ok && err == nil && ctx.Err() == nil {
								runtime.Gosched()
								ok, err = pr.Parrived(j)
							}
							switch {
							case err != nil:
								return err
							case covered && !ok:
								return fmt.Errorf("round %d: partition %d not arrived: %w", r, j, ctx.Err())
							case !covered && ok:
								return fmt.Errorf("round %d: partition %d arrived with sender partitions 0..%d readied", r, j, i)
							case ok:
								if err := checkPart(buf[j*rl:(j+1)*rl], r, j*rl); err != nil {
									return fmt.Errorf("partition %d: %w", j, err)
								}
							}
						}
						if done, err := adi.TestAll(nil, pr); done && i < tc.sends-1 {
							return fmt.Errorf("round %d: receive complete after sender partition %d of %d (%v)", r, i, tc.sends, err)
						}
						if err := cs[1].Send(ctx, []byte{byte(i)}, 0, tag); err != nil {
							return err
						}
					}
					if _, err := pr.Wait(ctx); err != nil {
						return err
					}
				}
				return nil
			}
			both(t, send, recv)
		})
	}
}

// TestPartitionedInitOrder: two partitioned channels between the same
// ranks with the same tag match by the order of their inits, whatever
// order they are started and readied in.
func TestPartitionedInitOrder(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	const tag = 3
	lenA, lenB := 2*100, 3*700
	send := func() error {
		a, b := make([]byte, lenA), make([]byte, lenB)
		pa, err := cs[0].PsendInit(a, 2, 1, tag)
		if err != nil {
			return err
		}
		pb, err := cs[0].PsendInit(b, 3, 1, tag)
		if err != nil {
			return err
		}
		for r := range 3 {
			fillPart(a, r, 0)
			fillPart(b, r+100, 0)
			if err := pb.Start(); err != nil {
				return err
			}
			if err := pb.PreadyRange(0, 2); err != nil {
				return err
			}
			if err := pa.Start(); err != nil {
				return err
			}
			if err := pa.PreadyList([]int{1, 0}); err != nil {
				return err
			}
			if _, err := adi.WaitAll(ctx, pa, pb); err != nil {
				return fmt.Errorf("round %d: %w", r, err)
			}
		}
		return nil
	}
	recv := func() error {
		a, b := make([]byte, lenA), make([]byte, lenB)
		ra, err := cs[1].PrecvInit(a, 4, 0, tag)
		if err != nil {
			return err
		}
		rb, err := cs[1].PrecvInit(b, 1, 0, tag)
		if err != nil {
			return err
		}
		for r := range 3 {
			if err := adi.StartAll(rb, ra); err != nil {
				return err
			}
			if _, err := adi.WaitAll(ctx, rb, ra); err != nil {
				return fmt.Errorf("round %d: %w", r, err)
			}
			if err := errors.Join(checkPart(a, r, 0), checkPart(b, r+100, 0)); err != nil {
				return err
			}
		}
		return nil
	}
	both(t, send, recv)
}

// TestPartitionedBesideSendRecv: partitioned messages and ordinary ones
// with the same tag between the same ranks never match each other, even
// a wildcard receive posted before the partitioned traffic starts.
func TestPartitionedBesideSendRecv(t *testing.T) {
	for _, size := range []int{64, 1400} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			const tag = 1
			send := func() error {
				buf := make([]byte, 2*size)
				fillPart(buf, 9, 0)
				ps, err := cs[0].PsendInit(buf, 2, 1, tag)
				if err != nil {
					return err
				}
				if err := cs[0].Send(ctx, []byte("before"), 1, tag); err != nil {
					return err
				}
				if err := cs[0].Barrier(ctx); err != nil {
					return err
				}
				if err := ps.Start(); err != nil {
					return err
				}
				if err := ps.PreadyRange(0, 1); err != nil {
					return err
				}
				if _, err := ps.Wait(ctx); err != nil {
					return err
				}
				return errors.Join(cs[0].Send(ctx, []byte("first"), 1, 0), cs[0].Send(ctx, []byte("second"), 1, tag))
			}
			recv := func() error {
				buf := make([]byte, 2*size)
				pr, err := cs[1].PrecvInit(buf, 2, 0, tag)
				if err != nil {
					return err
				}
				anyBuf, tagged := make([]byte, 4096), make([]byte, 4096)
				if _, err := cs[1].Recv(ctx, tagged, 0, tag); err != nil {
					return err
				}
				if got := string(tagged[:6]); got != "before" {
					return fmt.Errorf("ordinary message before: %q", got)
				}
				wild, err := cs[1].Irecv(anyBuf, adi.AnySource, adi.AnyTag)
				if err != nil {
					return err
				}
				exact, err := cs[1].Irecv(tagged, 0, tag)
				if err != nil {
					return err
				}
				if err := cs[1].Barrier(ctx); err != nil {
					return err
				}
				if err := pr.Start(); err != nil {
					return err
				}
				sts, err := adi.WaitAll(ctx, wild, exact, pr)
				if err != nil {
					return err
				}
				if got := string(anyBuf[:sts[0].Count]); got != "first" || sts[0].Tag != 0 {
					return fmt.Errorf("wildcard receive got %q, tag %d; want \"first\", tag 0", got, sts[0].Tag)
				}
				if got := string(tagged[:sts[1].Count]); got != "second" {
					return fmt.Errorf("receive with tag %d got %q, want \"second\"", tag, got)
				}
				return checkPart(buf, 9, 0)
			}
			both(t, send, recv)
		})
	}
}

// TestPartitionedArguments: bad arguments to the inits, and Pready and
// Parrived on requests that are not partitioned, or of the other side.
func TestPartitionedArguments(t *testing.T) {
	cs := loopJob(t, 2)
	c := cs[0]
	buf := make([]byte, 12)
	for _, tc := range []struct {
		name string
		init func() (*adi.Request, error)
		is   error
	}{
		{"length not a multiple", func() (*adi.Request, error) { return c.PsendInit(make([]byte, 10), 3, 1, 0) }, nil},
		{"no partitions", func() (*adi.Request, error) { return c.PsendInit(buf, 0, 1, 0) }, nil},
		{"negative partitions", func() (*adi.Request, error) { return c.PrecvInit(buf, -2, 1, 0) }, nil},
		{"AnySource", func() (*adi.Request, error) { return c.PrecvInit(buf, 2, adi.AnySource, 0) }, nil},
		{"AnyTag", func() (*adi.Request, error) { return c.PrecvInit(buf, 2, 1, adi.AnyTag) }, nil},
		{"bad rank", func() (*adi.Request, error) { return c.PsendInit(buf, 2, 2, 0) }, adi.ErrRank},
		{"bad tag", func() (*adi.Request, error) { return c.PsendInit(buf, 2, 1, -7) }, adi.ErrTag},
	} {
		q, err := tc.init()
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("%s: %v, %v; want an error (%v)", tc.name, q, err, tc.is)
		}
	}
	ps, err := c.PsendInit(buf, 2, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := c.PrecvInit(buf, 2, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := c.Isend(nil, adi.ProcNull, 0)
	if err != nil {
		t.Fatal(err)
	}
	persistent, err := c.SendInit(buf, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"Pready of Isend", plain.Pready(0), "not a partitioned request"},
		{"PreadyRange of SendInit", persistent.PreadyRange(0, 1), "not a partitioned request"},
		{"Pready of PrecvInit", pr.Pready(0), "receive"},
		{"PreadyList of PrecvInit", pr.PreadyList([]int{0}), "receive"},
		{"Parrived of PsendInit", second(ps.Parrived(0)), "send"},
		{"Parrived of Isend", second(plain.Parrived(0)), "not a partitioned request"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, tc.err, tc.want)
		}
	}
}

func second(_ bool, err error) error { return err }

// TestPartitionedRules: Pready outside a round, out of range or twice is
// refused; a refused range or list readies nothing; Start of a running
// round is refused; Parrived answers true outside a round and refuses a
// partition out of range.
func TestPartitionedRules(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	sbuf, rbuf := make([]byte, 4*10), make([]byte, 4*10)
	ps, err := cs[0].PsendInit(sbuf, 4, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := cs[1].PrecvInit(rbuf, 2, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	mustErr := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", what, err, want)
		}
	}
	mustErr("Pready before Start", ps.Pready(0), "inactive")
	if ok, err := pr.Parrived(1); !ok || err != nil {
		t.Errorf("Parrived before Start: %v, %v; want true (MPI: an inactive request)", ok, err)
	}
	_, err = pr.Parrived(2)
	mustErr("Parrived(2) of 2", err, "not in [0,2)")
	if _, err := ps.Wait(ctx); err != nil {
		t.Errorf("Wait before Start: %v", err)
	}
	if err := adi.StartAll(ps, pr); err != nil {
		t.Fatal(err)
	}
	if err := ps.Start(); !errors.Is(err, adi.ErrRequestBusy) {
		t.Errorf("Start of a running round: %v, want ErrRequestBusy", err)
	}
	mustErr("Pready(4) of 4", ps.Pready(4), "not in [0,4)")
	mustErr("Pready(-1)", ps.Pready(-1), "not in [0,4)")
	mustErr("PreadyRange(2, 1)", ps.PreadyRange(2, 1), "not a range")
	mustErr("PreadyRange(3, 4)", ps.PreadyRange(3, 4), "not a range")
	mustErr("PreadyList(0, 9)", ps.PreadyList([]int{0, 9}), "partition 9")
	if ok, err := pr.Parrived(0); ok || err != nil {
		t.Errorf("Parrived with nothing readied: %v, %v", ok, err)
	}
	// None of the refused calls readied anything.
	if err := ps.Pready(0); err != nil {
		t.Errorf("Pready(0) after refused ranges and lists: %v", err)
	}
	mustErr("Pready(0) twice", ps.Pready(0), "already ready")
	mustErr("PreadyList(1, 1)", ps.PreadyList([]int{1, 1}), "partition 1 is already ready")
	if err := ps.PreadyRange(2, 3); err != nil {
		t.Errorf("PreadyRange(2, 3): %v", err)
	}
	if _, err := adi.WaitAll(ctx, ps, pr); err != nil {
		t.Fatal(err)
	}
	mustErr("Pready after the round", ps.Pready(3), "inactive")
	if ok, err := pr.Parrived(0); !ok || err != nil {
		t.Errorf("Parrived after the round: %v, %v; want true", ok, err)
	}
}

// TestPartitionedLengthMismatch: a receive that matched a send of
// another length fails every round with ErrPartitionLength and leaves
// its buffer alone; the send completes, eager or rendezvous.
func TestPartitionedLengthMismatch(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		sends, slen, recvs, rlen int
	}{
		{"longer/eager", 4, 4 * 100, 3, 3 * 100},
		{"shorter/eager", 2, 2 * 50, 4, 4 * 50},
		{"longer/rendezvous", 4, 4 * 700, 2, 2 * 1000},
		{"shorter/rendezvous", 2, 2 * 600, 1, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			send := func() error {
				buf := make([]byte, tc.slen)
				fillPart(buf, 1, 0)
				ps, err := cs[0].PsendInit(buf, tc.sends, 1, 4)
				if err != nil {
					return err
				}
				for r := range 3 {
					if err := ps.Start(); err != nil {
						return err
					}
					if err := ps.PreadyRange(0, tc.sends-1); err != nil {
						return err
					}
					if _, err := ps.Wait(ctx); err != nil {
						return fmt.Errorf("round %d: %w", r, err)
					}
				}
				return nil
			}
			recv := func() error {
				buf := make([]byte, tc.rlen)
				pr, err := cs[1].PrecvInit(buf, tc.recvs, 0, 4)
				if err != nil {
					return err
				}
				for r := range 2 {
					if err := pr.Start(); err != nil {
						return err
					}
					if _, err := pr.Wait(ctx); !errors.Is(err, adi.ErrPartitionLength) {
						return fmt.Errorf("round %d: %v, want ErrPartitionLength", r, err)
					}
					if !bytes.Equal(buf, make([]byte, tc.rlen)) {
						return fmt.Errorf("round %d: the receive buffer was written", r)
					}
				}
				// A third round: Parrived reports the mismatch too.
				if err := pr.Start(); err != nil {
					return err
				}
				if _, err := pr.Parrived(0); !errors.Is(err, adi.ErrPartitionLength) {
					return fmt.Errorf("Parrived in a round that cannot receive: %v, want ErrPartitionLength", err)
				}
				_, err = pr.Wait(ctx)
				if !errors.Is(err, adi.ErrPartitionLength) {
					return fmt.Errorf("third round: %v", err)
				}
				return nil
			}
			both(t, send, recv)
		})
	}
}

// TestPartitionedFinalize: Finalize with partitioned rounds in flight (a
// receive waiting for its setup, a send whose partitions nobody
// receives, a send not all readied) fails them with ErrFinalized and
// leaves no goroutine behind.
func TestPartitionedFinalize(t *testing.T) {
	ws, _ := loopWorlds(t, 2)
	c0, c1 := ws[0].Comm(), ws[1].Comm()
	ctx := ctxT(t)
	pr, err := c1.PrecvInit(make([]byte, 100), 2, 0, 1) // its send is never started
	if err != nil {
		t.Fatal(err)
	}
	ps, err := c0.PsendInit(make([]byte, 2*700), 2, 1, 2) // its receive is never made
	if err != nil {
		t.Fatal(err)
	}
	partial, err := c0.PsendInit(make([]byte, 40), 4, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := adi.StartAll(pr, ps, partial); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(ps.PreadyRange(0, 1), partial.Pready(2)); err != nil {
		t.Fatal(err)
	}
	// Two workers wait (for the receive's setup, for the send's
	// clear-to-send), once they have run up to their wait.
	for stacks := ""; strings.Count(stacks, "adi.(*partitioned)") < 2; {
		if ctx.Err() != nil {
			t.Fatalf("no workers wait for the rounds in flight: the test tests nothing\n%s", stacks)
		}
		runtime.Gosched()
		b := make([]byte, 1<<20)
		stacks = string(b[:runtime.Stack(b, true)])
	}
	each(t, []*adi.Comm{c0, c1}, func(c *adi.Comm) error {
		return ws[c.Rank()].Finalize(context.Background())
	})
	for name, q := range map[string]*adi.Request{"receive": pr, "send": ps} {
		if _, err := q.Wait(ctx); !errors.Is(err, adi.ErrFinalized) {
			t.Errorf("%s in flight at Finalize: %v, want ErrFinalized", name, err)
		}
	}
	if err := partial.Pready(0); !errors.Is(err, adi.ErrFinalized) {
		t.Errorf("Pready after Finalize: %v, want ErrFinalized", err)
	}
	if g := leakcheck.Goroutines("adi.(*partitioned)"); g != "" {
		t.Errorf("goroutines left:\n%s", g)
	}
}

// TestPartitionedProcNull: with ProcNull as the peer a round completes
// once all its partitions are readied (send) or at once (receive).
func TestPartitionedProcNull(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	ps, err := cs[0].PsendInit(make([]byte, 8), 2, adi.ProcNull, 0)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := cs[0].PrecvInit(make([]byte, 8), 4, adi.ProcNull, 0)
	if err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		if err := adi.StartAll(ps, pr); err != nil {
			t.Fatal(err)
		}
		if _, done, _ := ps.Test(); done {
			t.Fatalf("round %d: send to ProcNull complete before its partitions are readied", r)
		}
		if err := ps.PreadyList([]int{1, 0}); err != nil {
			t.Fatal(err)
		}
		sts, err := adi.WaitAll(ctx, ps, pr)
		if err != nil {
			t.Fatal(err)
		}
		if sts[1].Source != adi.ProcNull {
			t.Errorf("receive from ProcNull: %+v", sts[1])
		}
	}
}

// TestPartitionedEmptyManyPartitions: an empty buffer travels as one
// empty message whatever its partition count, so a million partitions
// cost neither side a request each (they cost ~240 bytes apiece, 250 MB
// here, when each was a message); the round still completes only once
// every partition is readied, and readies each once.
func TestPartitionedEmptyManyPartitions(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	const parts = 1 << 20
	var m0, m1, m2 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	ps, err := cs[0].PsendInit(nil, parts, 1, 6)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := cs[1].PrecvInit(nil, 3, 0, 6)
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&m1)
	for r := range 3 {
		if err := adi.StartAll(ps, pr); err != nil {
			t.Fatal(err)
		}
		if err := ps.PreadyRange(0, parts-2); err != nil {
			t.Fatal(err)
		}
		if err := ps.Pready(parts / 2); err == nil || !strings.Contains(err.Error(), "already ready") {
			t.Errorf("round %d: Pready of a readied partition: %v", r, err)
		}
		if _, done, _ := ps.Test(); done {
			t.Fatalf("round %d: send complete with a partition not readied", r)
		}
		if done, _ := adi.TestAll(nil, pr); done {
			t.Fatalf("round %d: receive complete with a sender partition not readied", r)
		}
		if ok, err := pr.Parrived(2); ok || err != nil {
			t.Fatalf("round %d: Parrived with a sender partition not readied: %v, %v", r, ok, err)
		}
		if err := ps.Pready(parts - 1); err != nil {
			t.Fatal(err)
		}
		sts, err := adi.WaitAll(ctx, ps, pr)
		if err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		if sts[1].Count != 0 || sts[1].Source != 0 {
			t.Errorf("round %d: receive status %+v", r, sts[1])
		}
		if r == 0 {
			runtime.ReadMemStats(&m2)
		}
	}
	// A bit per partition (128 KiB) and small change; a request per
	// partition would be 250 MB, at init on the sender, at the first
	// round on the receiver.
	if init, first := m1.TotalAlloc-m0.TotalAlloc, m2.TotalAlloc-m1.TotalAlloc; init > 1<<20 || first > 1<<20 {
		t.Errorf("%d partitions of an empty buffer allocated %d bytes at init, %d in the first round", parts, init, first)
	}
}

// TestPartitionedBadSetup: a setup the receiver cannot take (an empty
// buffer in several messages, as a build before that was refused sent
// it; a longer one, which does not fit; another version) fails the
// receive's round with an error saying so, and every later Start and
// Wait with the same error, at once: the sender sends its setup once, so
// a later round waiting for another would wait forever. The sender of
// the empty messages is not held up.
func TestPartitionedBadSetup(t *testing.T) {
	valid := []byte{1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} // 5 messages, 0 bytes
	for _, tc := range []struct {
		name    string
		setup   []byte
		empties int
		want    string
		is      error
	}{
		{"empty in 5 messages", valid, 5, "0 bytes in 5 messages", nil},
		{"longer", append(append([]byte{}, valid[:4]...), 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), 1, "setup", adi.ErrTruncated},
		{"other version", append([]byte{2}, valid[1:]...), 5, "version 2", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := loopJob(t, 2)
			ctx := ctxT(t)
			pr, err := cs[1].PrecvInit(nil, 3, 0, 8)
			if err != nil {
				t.Fatal(err)
			}
			if err := pr.Start(); err != nil {
				t.Fatal(err)
			}
			if err := adi.SendPartitionedSetup(ctx, cs[0], 1, 8, tc.setup, tc.empties); err != nil {
				t.Fatalf("sender: %v", err)
			}
			check := func(what string, err error) {
				t.Helper()
				if err == nil || !strings.Contains(err.Error(), tc.want) || tc.is != nil && !errors.Is(err, tc.is) {
					t.Errorf("%s: %v, want an error saying %q (%v)", what, err, tc.want, tc.is)
				}
			}
			_, err = pr.Wait(ctx)
			check("first round", err)
			first := err
			for r := 1; r < 3; r++ {
				err := pr.Start()
				check(fmt.Sprintf("Start of round %d", r), err)
				_, done, werr := pr.Test()
				if !done {
					t.Fatalf("round %d waits for a setup that never comes", r)
				}
				check(fmt.Sprintf("round %d", r), werr)
				if werr != nil && first != nil && werr.Error() != first.Error() {
					t.Errorf("round %d: %v, want the first round's %v", r, werr, first)
				}
				_, perr := pr.Parrived(0)
				check(fmt.Sprintf("Parrived in round %d", r), perr)
			}
		})
	}
}

// TestPartitionedPostFails: a receive of a round that fails to start (as
// one a lost peer left unreusable, or one a matching subdevice refused,
// does) fails the round and breaks the channel: without that the next
// round's receives would take the messages the round left unmatched,
// the round before's bytes.
func TestPartitionedPostFails(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	const sends, recvs, length = 4, 2, 4 * 100
	sbuf, rbuf := make([]byte, length), make([]byte, length)
	ps, err := cs[0].PsendInit(sbuf, sends, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := cs[1].PrecvInit(rbuf, recvs, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	round := func(r int) (startErr, waitErr error) {
		fillPart(sbuf, r, 0)
		if err := ps.Start(); err != nil {
			t.Fatalf("round %d: sender: %v", r, err)
		}
		startErr = pr.Start()
		if err := ps.PreadyRange(0, sends-1); err != nil {
			t.Fatalf("round %d: sender: %v", r, err)
		}
		if _, err := ps.Wait(ctx); err != nil {
			t.Fatalf("round %d: sender: %v", r, err)
		}
		_, waitErr = pr.Wait(ctx)
		return startErr, waitErr
	}
	if s, w := round(0); s != nil || w != nil || checkPart(rbuf, 0, 0) != nil {
		t.Fatalf("round 0: %v, %v, %v", s, w, checkPart(rbuf, 0, 0))
	}
	release, err := adi.OccupyPartitioned(pr, 1)
	if err != nil {
		t.Fatal(err)
	}
	s, w := round(1)
	if s != nil || !errors.Is(w, adi.ErrRequestBusy) {
		t.Errorf("round 1, message 1's receive busy: Start %v, Wait %v; want Wait to fail with ErrRequestBusy", s, w)
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	if s, w := round(2); s == nil || w == nil {
		t.Errorf("round 2 after a round that left messages unmatched: Start %v, Wait %v; want both to fail (round 2's bytes right: %v)", s, w, checkPart(rbuf, 2, 0))
	} else if !errors.Is(s, adi.ErrRequestBusy) || w.Error() != s.Error() {
		t.Errorf("round 2: Start %v, Wait %v; want round 1's ErrRequestBusy", s, w)
	}
}

// TestPartitionedSendFails: a partition's send that fails to start
// fails its round and breaks the channel: the receive posted for it
// would take the next round's message.
func TestPartitionedSendFails(t *testing.T) {
	cs := loopJob(t, 2)
	ctx := ctxT(t)
	sbuf, rbuf := make([]byte, 4*100), make([]byte, 4*100)
	ps, err := cs[0].PsendInit(sbuf, 4, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := cs[1].PrecvInit(rbuf, 4, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := adi.StartAll(ps, pr); err != nil {
		t.Fatal(err)
	}
	if err := ps.PreadyRange(0, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := adi.WaitAll(ctx, ps, pr); err != nil {
		t.Fatal(err)
	}
	release, err := adi.OccupyPartitioned(ps, 2)
	if err != nil {
		t.Fatal(err)
	}
	// The receive's round waits for a message 2 that never comes until
	// Finalize fails it.
	if err := adi.StartAll(ps, pr); err != nil {
		t.Fatal(err)
	}
	if err := ps.PreadyRange(0, 3); !errors.Is(err, adi.ErrRequestBusy) {
		t.Errorf("PreadyRange with partition 2's send busy: %v, want ErrRequestBusy", err)
	}
	if _, err := ps.Wait(ctx); !errors.Is(err, adi.ErrRequestBusy) {
		t.Errorf("round with partition 2 unsent: %v, want ErrRequestBusy", err)
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		err := ps.Start()
		_, done, werr := ps.Test()
		if !errors.Is(err, adi.ErrRequestBusy) || !done || werr == nil || werr.Error() != err.Error() {
			t.Errorf("Start %d after a round with a partition unsent: %v, Test %v, %v; want both to fail with that round's error", r, err, done, werr)
		}
	}
}

// BenchmarkPartitioned: a round of a partitioned message between two
// ranks on the loopback fabric, per partition: ns/partition, the bytes
// allocated per partition per round (B/partition), and the bytes
// allocated per partition by the inits and the first round, buffers
// included (init-B/partition). Partitions of 0 bytes (an empty buffer, one
// message a round), 64 (eager) and 1024 (rendezvous).
func BenchmarkPartitioned(b *testing.B) {
	for _, size := range []int{0, 64, 1024} {
		for _, parts := range []int{16, 1024} {
			b.Run(fmt.Sprintf("%dB/%dparts", size, parts), func(b *testing.B) {
				cs := loopJob(b, 2)
				ctx := ctxT(b)
				var m0, m1 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m0)
				ps, err := cs[0].PsendInit(make([]byte, size*parts), parts, 1, 0)
				if err != nil {
					b.Fatal(err)
				}
				pr, err := cs[1].PrecvInit(make([]byte, size*parts), parts, 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				round := func() {
					if err := adi.StartAll(ps, pr); err != nil {
						b.Fatal(err)
					}
					if err := ps.PreadyRange(0, parts-1); err != nil {
						b.Fatal(err)
					}
					if _, err := adi.WaitAll(ctx, ps, pr); err != nil {
						b.Fatal(err)
					}
				}
				round()
				runtime.ReadMemStats(&m1)
				b.ResetTimer()
				for b.Loop() {
					round()
				}
				b.StopTimer()
				var m2 runtime.MemStats
				runtime.ReadMemStats(&m2)
				n := float64(b.N) * float64(parts)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/partition")
				b.ReportMetric(float64(m2.TotalAlloc-m1.TotalAlloc)/n, "B/partition")
				// After the loop: ResetTimer drops the metrics reported before.
				b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(parts), "init-B/partition")
			})
		}
	}
}

// partitionedAcrossProcesses is the "partitioned" role of
// TestJobsThroughMdrun: rounds of partitioned messages from rank 0 to
// rank 1 in processes of their own (over shm), cut alike or not, eager
// and far beyond the eager limit, and an empty one in many partitions;
// rank 0's goroutines ready the partitions at once, rank 1 checks each
// partition as Parrived reports it and starts some rounds late, so that
// the sender's messages come before its receives.
func partitionedAcrossProcesses(ctx context.Context, c *adi.Comm) error {
	for tag, tc := range []struct{ sends, recvs, length int }{
		{3, 7, 21 * 4}, {3, 7, 21 * 3000}, {7, 3, 21 * 50000}, {1, 5, 5 << 18}, {64, 3, 64 * 3 * 1000}, {1000, 3, 0},
	} {
		const rounds = 5
		sl, rl := tc.length/tc.sends, tc.length/tc.recvs
		buf := make([]byte, tc.length)
		if c.Rank() == 0 {
			ps, err := c.PsendInit(buf, tc.sends, 1, tag)
			if err != nil {
				return err
			}
			for r := range rounds {
				if err := ps.Start(); err != nil {
					return err
				}
				errs := make([]error, tc.sends)
				var wg sync.WaitGroup
				for i := range tc.sends {
					wg.Go(func() {
						fillPart(buf[i*sl:(i+1)*sl], r, i*sl)
						errs[i] = ps.Pready(i)
					})
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					return fmt.Errorf("case %d, round %d: %w", tag, r, err)
				}
				if _, err := ps.Wait(ctx); err != nil {
					return fmt.Errorf("case %d, round %d: %w", tag, r, err)
				}
			}
			continue
		}
		pr, err := c.PrecvInit(buf, tc.recvs, 0, tag)
		if err != nil {
			return err
		}
		for r := range rounds {
			if r%2 == 0 {
				time.Sleep(5 * time.Millisecond) // not asserted: lets the sender run ahead
			}
			if err := pr.Start(); err != nil {
				return err
			}
			seen := make([]bool, tc.recvs)
			for left := tc.recvs; left > 0; {
				for j := range seen {
					if seen[j] {
						continue
					}
					ok, err := pr.Parrived(j)
					if err != nil {
						return fmt.Errorf("case %d, round %d: %w", tag, r, err)
					}
					if ok {
						if err := checkPart(buf[j*rl:(j+1)*rl], r, j*rl); err != nil {
							return fmt.Errorf("case %d: partition %d reported arrived: %w", tag, j, err)
						}
						seen[j] = true
						left--
					}
				}
				if ctx.Err() != nil {
					return fmt.Errorf("case %d, round %d: partitions arrived: %v: %w", tag, r, seen, ctx.Err())
				}
				runtime.Gosched()
			}
			st, err := pr.Wait(ctx)
			if err != nil {
				return fmt.Errorf("case %d, round %d: %w", tag, r, err)
			}
			if st.Count != tc.length {
				return fmt.Errorf("case %d, round %d: status %+v", tag, r, st)
			}
			if err := checkPart(buf, r, 0); err != nil {
				return fmt.Errorf("case %d: %w", tag, err)
			}
		}
	}
	return nil
}
