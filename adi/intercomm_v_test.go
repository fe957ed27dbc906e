package adi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// vSplits are the group sizes the v-form and reduce-scatter collectives
// are tested with: one rank against two, two against three, three
// against one, and four against three with group 1's leader the lower
// world rank.
var vSplits = []split{
	{"1|2", 3, below(1), nil},
	splits[3], // 2|3
	splits[2], // 3|1
	splits[6], // evens|odds reversed: 4|3
}

// blockSizes give the length of the block world rank src sends world
// rank dst: uneven, a third of them empty, and for "large" mostly past
// the loopback's eager limit of 512 bytes, so by rendezvous.
var blockSizes = []struct {
	name string
	n    func(src, dst int) int
}{
	{"small", func(src, dst int) int { return (src + 2*dst) % 3 * 40 }},
	{"large", func(src, dst int) int { return (src + 2*dst) % 3 * 700 }},
}

// rootOf returns what rank x passes as the root when the root is rank
// rootRank of group rootColor, and whether x is it.
func rootOf(s split, x *icRank, rootColor, rootRank int) (int, bool) {
	switch {
	case x.color != rootColor:
		return rootRank, false
	case x.me == s.members(rootColor)[rootRank]:
		return adi.Root, true
	}
	return adi.ProcNull, false
}

// TestIntercommVCollectives: Gatherv and Scatterv from every root of
// both groups, Allgatherv and Alltoallv, with uneven blocks, empty ones
// among them: every rank of both groups gets the other group's blocks.
func TestIntercommVCollectives(t *testing.T) {
	for _, s := range vSplits {
		t.Run(s.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			for _, bs := range blockSizes {
				n := bs.n
				for rootColor := range 2 {
					for rootRank, rootWorld := range s.members(rootColor) {
						t.Run(fmt.Sprintf("gatherv/%s/root %d of group %d", bs.name, rootRank, rootColor), func(t *testing.T) {
							eachIC(t, xs, func(x *icRank) error {
								root, isRoot := rootOf(s, x, rootColor, rootRank)
								var recv [][]byte
								if isRoot {
									for _, wr := range x.remote {
										recv = append(recv, make([]byte, n(wr, rootWorld)))
									}
								}
								if err := x.ic.Gatherv(ctx, pattern(x.me, rootWorld, n(x.me, rootWorld)), recv, root); err != nil {
									return err
								}
								for j, wr := range x.remote {
									if want := pattern(wr, rootWorld, n(wr, rootWorld)); isRoot && !bytes.Equal(recv[j], want) {
										return fmt.Errorf("block of remote rank %d: got %v, want %v", j, recv[j], want)
									}
								}
								return nil
							})
						})
						t.Run(fmt.Sprintf("scatterv/%s/root %d of group %d", bs.name, rootRank, rootColor), func(t *testing.T) {
							eachIC(t, xs, func(x *icRank) error {
								root, isRoot := rootOf(s, x, rootColor, rootRank)
								var send [][]byte
								if isRoot {
									for _, wr := range x.remote {
										send = append(send, pattern(rootWorld, wr, n(rootWorld, wr)))
									}
								}
								recv := make([]byte, n(rootWorld, x.me))
								if x.color == rootColor {
									recv = nil // not used
								}
								if err := x.ic.Scatterv(ctx, send, recv, root); err != nil {
									return err
								}
								if want := pattern(rootWorld, x.me, n(rootWorld, x.me)); x.color != rootColor && !bytes.Equal(recv, want) {
									return fmt.Errorf("got %v, want %v", recv, want)
								}
								return nil
							})
						})
					}
				}
				t.Run("allgatherv/"+bs.name, func(t *testing.T) {
					eachIC(t, xs, func(x *icRank) error {
						recv := make([][]byte, len(x.remote))
						for j, wr := range x.remote {
							recv[j] = make([]byte, n(wr, 0))
						}
						if err := x.ic.Allgatherv(ctx, pattern(x.me, 0, n(x.me, 0)), recv); err != nil {
							return err
						}
						for j, wr := range x.remote {
							if want := pattern(wr, 0, n(wr, 0)); !bytes.Equal(recv[j], want) {
								return fmt.Errorf("block of remote rank %d: got %v, want %v", j, recv[j], want)
							}
						}
						return nil
					})
				})
				t.Run("alltoallv/"+bs.name, func(t *testing.T) {
					eachIC(t, xs, func(x *icRank) error {
						send, recv := make([][]byte, len(x.remote)), make([][]byte, len(x.remote))
						for j, wr := range x.remote {
							send[j] = pattern(x.me, wr, n(x.me, wr))
							recv[j] = make([]byte, n(wr, x.me))
						}
						if err := x.ic.Alltoallv(ctx, send, recv); err != nil {
							return err
						}
						for j, wr := range x.remote {
							if want := pattern(wr, x.me, n(wr, x.me)); !bytes.Equal(recv[j], want) {
								return fmt.Errorf("block from remote rank %d: got %v, want %v", j, recv[j], want)
							}
						}
						return nil
					})
				})
			}
		})
	}
}

// unevenCounts cuts total elements over p ranks unevenly: rank r gets a
// share weighted r, so rank 0 none where p > 1, and the last the rest.
func unevenCounts(p, total int) []int {
	counts := make([]int, p)
	if p == 1 {
		counts[0] = total
		return counts
	}
	w, left := p*(p-1)/2, total
	for r := range p - 1 {
		counts[r] = total * r / w
		left -= counts[r]
	}
	counts[p-1] = left
	return counts
}

// TestIntercommReduceScatter: each rank gets its part of the other
// group's combination in that group's rank order (affine maps do not
// commute), with uneven counts, empty parts included, and with blocks;
// small, by rendezvous, and past the size where Reduce halves.
func TestIntercommReduceScatter(t *testing.T) {
	for _, s := range vSplits {
		t.Run(s.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			p := [2]int{len(s.members(0)), len(s.members(1))}
			for _, total := range []int{0, 7, 700, 9000} { // 700 elements: 5600 bytes; 9000: 72000, halved
				t.Run(fmt.Sprintf("uneven/%d elements", total), func(t *testing.T) {
					eachIC(t, xs, func(x *icRank) error {
						counts := unevenCounts(p[x.color], total)
						me := x.ic.Rank()
						got := make([]uint64, counts[me])
						if err := adi.InterReduceScatter(ctx, x.ic, contribution(x.me, total), got, counts, affine); err != nil {
							return err
						}
						off := 0
						for _, c := range counts[:me] {
							off += c
						}
						if want := fold(x.remote, total)[off : off+counts[me]]; !equal(got, want) {
							return fmt.Errorf("counts %v: got %x, want %x", counts, got, want)
						}
						return nil
					})
				})
			}
			// Each group's blocks are as long as make its sends as long
			// as the other's: p0*m0 == p1*m1.
			for _, f := range []int{0, 1, 40} {
				total := p[0] * p[1] * f
				t.Run(fmt.Sprintf("block/%d elements", total), func(t *testing.T) {
					eachIC(t, xs, func(x *icRank) error {
						m, me := total/p[x.color], x.ic.Rank()
						got := make([]uint64, m)
						if err := adi.InterReduceScatterBlock(ctx, x.ic, contribution(x.me, total), got, affine); err != nil {
							return err
						}
						if want := fold(x.remote, total)[me*m : (me+1)*m]; !equal(got, want) {
							return fmt.Errorf("got %x, want %x", got, want)
						}
						return nil
					})
				})
			}
		})
	}
}

// TestIntercommVMismatch: a block whose length disagrees between its
// sender and its receiver is ErrMismatch on exactly the ranks, of either
// group, whose result depends on it, and every other rank succeeds; the
// error names the rank it came from. Afterwards the intercommunicator
// still works.
func TestIntercommVMismatch(t *testing.T) {
	s := splits[3] // group 0: world 0, 1; group 1: world 2, 3, 4
	xs := intercomms(t, s)
	ctx := ctxT(t)
	// blocks makes the slices of x for the blocks of its remote ranks,
	// n bytes each, but short of one byte in remote rank odd's where x is
	// world rank who (and one byte long in remote rank long's, unless
	// that is -1).
	blocks := func(x *icRank, n, who, odd, long int) [][]byte {
		b := make([][]byte, len(x.remote))
		for j := range b {
			m := n
			switch {
			case x.me == who && j == odd:
				m--
			case x.me == who && j == long:
				m++
			}
			b[j] = make([]byte, m)
		}
		return b
	}
	// root is what x passes for the root world rank w, rank r of its group.
	root := func(x *icRank, w, r int) int {
		switch {
		case x.color != s.color(w):
			return r
		case x.me == w:
			return adi.Root
		}
		return adi.ProcNull
	}
	for _, tc := range []struct {
		name string
		f    func(x *icRank, n int) error
		want []int          // the world ranks that get ErrMismatch
		text map[int]string // in the error of these world ranks
	}{
		{"gatherv into the root of group 0, a block short", func(x *icRank, n int) error {
			var recv [][]byte
			if x.me == 1 {
				recv = blocks(x, n, 1, 2, -1)
			}
			return x.ic.Gatherv(ctx, make([]byte, n), recv, root(x, 1, 1))
		}, []int{1}, map[int]string{1: "from rank 2: " + adi.ErrMismatch.Error() + ": more than"}},
		{"gatherv into the root of group 1, a block long", func(x *icRank, n int) error {
			var recv [][]byte
			if x.me == 3 {
				recv = blocks(x, n, 3, -1, 0)
			}
			return x.ic.Gatherv(ctx, make([]byte, n), recv, root(x, 3, 1))
		}, []int{3}, map[int]string{3: "from rank 0: "}},
		{"scatterv from group 1, a receive short", func(x *icRank, n int) error {
			var send [][]byte
			if x.me == 2 {
				send = blocks(x, n, -1, -1, -1)
			}
			recv := make([]byte, n)
			if x.me == 1 {
				recv = recv[:n-1]
			}
			return x.ic.Scatterv(ctx, send, recv, root(x, 2, 0))
		}, []int{1}, map[int]string{1: "from rank 0: "}},
		{"allgatherv, group 1's leader short of a block", func(x *icRank, n int) error {
			return x.ic.Allgatherv(ctx, make([]byte, n), blocks(x, n, 2, 1, -1))
		}, []int{2, 3, 4}, map[int]string{2: "from rank 1: ", 3: "local group", 4: "local group"}},
		{"allgatherv, group 0's leader short of a block", func(x *icRank, n int) error {
			return x.ic.Allgatherv(ctx, make([]byte, n), blocks(x, n, 0, 2, -1))
		}, []int{0, 1}, map[int]string{0: "from rank 2: ", 1: "local group"}},
		{"allgatherv, a rank of group 0 sends a short block", func(x *icRank, n int) error {
			send := make([]byte, n)
			if x.me == 1 {
				send = send[:n-1]
			}
			return x.ic.Allgatherv(ctx, send, blocks(x, n, -1, -1, -1))
		}, []int{2, 3, 4}, map[int]string{2: "from rank 1: ", 3: "local group", 4: "local group"}},
		{"allgatherv, a rank of group 1 short of a block", func(x *icRank, n int) error {
			// World rank 4 is a leaf of its group's broadcast tree.
			return x.ic.Allgatherv(ctx, make([]byte, n), blocks(x, n, 4, 0, -1))
		}, []int{4}, map[int]string{4: "block of remote rank 0: " + adi.ErrMismatch.Error()}},
		{"allgatherv, a rank of group 1 cuts its blocks otherwise", func(x *icRank, n int) error {
			// The same total as its leader's: only the lengths tell.
			return x.ic.Allgatherv(ctx, make([]byte, n), blocks(x, n, 3, 0, 1))
		}, []int{3}, map[int]string{3: "block of remote rank 0: " + adi.ErrMismatch.Error()}},
		{"allgatherv, every block empty but a rank of group 1 expects one", func(x *icRank, n int) error {
			// The leader's total is 0: no blocks travel, but world 3's
			// slices still disagree with the lengths.
			recv := make([][]byte, len(x.remote))
			if x.me == 3 {
				recv[0] = make([]byte, 5)
			}
			return x.ic.Allgatherv(ctx, nil, recv)
		}, []int{3}, map[int]string{3: "block of remote rank 0: " + adi.ErrMismatch.Error()}},
		{"alltoallv, a rank of group 1 short of a block", func(x *icRank, n int) error {
			return x.ic.Alltoallv(ctx, blocks(x, n, -1, -1, -1), blocks(x, n, 3, 1, -1))
		}, []int{3}, map[int]string{3: "from rank 1: "}},
		{"alltoallv, a rank of group 0 long by a block", func(x *icRank, n int) error {
			return x.ic.Alltoallv(ctx, blocks(x, n, -1, -1, -1), blocks(x, n, 0, -1, 2))
		}, []int{0}, map[int]string{0: "from rank 2: "}},
		{"reduce_scatter, totals differ between the groups", func(x *icRank, n int) error {
			counts := unevenCounts(x.ic.Size(), n+x.color)
			return adi.InterReduceScatter(ctx, x.ic, make([]int64, n+x.color), make([]int64, counts[x.ic.Rank()]), counts, adi.Sum)
		}, []int{0, 1, 2, 3, 4}, map[int]string{0: "from rank 0: ", 1: "local group", 2: "from rank 0: ", 4: "local group"}},
		{"reduce_scatter, a rank's counts differ from its leader's", func(x *icRank, n int) error {
			counts := unevenCounts(x.ic.Size(), n)
			if x.me == 4 { // the same total, cut otherwise
				counts[1], counts[2] = counts[1]+1, counts[2]-1
			}
			return adi.InterReduceScatter(ctx, x.ic, make([]int64, n), make([]int64, counts[x.ic.Rank()]), counts, adi.Sum)
		}, []int{4}, map[int]string{4: "local group"}},
		{"reduce_scatter_block, totals differ between the groups", func(x *icRank, n int) error {
			m := n // 2n in group 0, 3n in group 1
			return adi.InterReduceScatterBlock(ctx, x.ic, make([]int64, m*x.ic.Size()), make([]int64, m), adi.Sum)
		}, []int{0, 1, 2, 3, 4}, nil},
	} {
		for _, n := range []int{8, 2000} { // eager and rendezvous
			t.Run(fmt.Sprintf("%s/%d", tc.name, n), func(t *testing.T) {
				eachIC(t, xs, func(x *icRank) error {
					err := tc.f(x, n)
					want := false
					for _, w := range tc.want {
						want = want || w == x.me
					}
					switch {
					case !want && err != nil:
						return fmt.Errorf("%v, want no error", err)
					case want && !errors.Is(err, adi.ErrMismatch):
						return fmt.Errorf("%v, want ErrMismatch", err)
					case want && !strings.Contains(err.Error(), tc.text[x.me]):
						return fmt.Errorf("%v, want it to say %q", err, tc.text[x.me])
					}
					return nil
				})
				// The intercommunicator still works.
				eachIC(t, xs, func(x *icRank) error { return x.ic.Barrier(ctx) })
			})
		}
	}
}

// TestIntercommVArguments: slices that do not fit the groups and counts
// that do not fit the send slice fail at once on the rank that passes
// them, before any communication: with a ctx that has ended, the error
// is theirs, not the ctx's.
func TestIntercommVArguments(t *testing.T) {
	xs := intercomms(t, splits[3])
	ctx, cancel := context.WithCancel(ctxT(t))
	cancel()
	x := xs[0] // group 0's leader; 3 remote ranks
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"gatherv receive slices", x.ic.Gatherv(ctx, nil, make([][]byte, 2), adi.Root)},
		{"gatherv root", x.ic.Gatherv(ctx, nil, nil, 3)},
		{"scatterv send slices", x.ic.Scatterv(ctx, make([][]byte, 4), nil, adi.Root)},
		{"scatterv root", x.ic.Scatterv(ctx, nil, nil, -7)},
		{"allgatherv receive slices", x.ic.Allgatherv(ctx, nil, make([][]byte, 2))},
		{"alltoallv send slices", x.ic.Alltoallv(ctx, make([][]byte, 2), make([][]byte, 3))},
		{"alltoallv receive slices", x.ic.Alltoallv(ctx, make([][]byte, 3), make([][]byte, 4))},
		{"reduce_scatter counts", adi.InterReduceScatter(ctx, x.ic, []int{1}, []int{1}, []int{1}, adi.Sum)},
		{"reduce_scatter negative count", adi.InterReduceScatter(ctx, x.ic, []int{1}, nil, []int{-1, 2}, adi.Sum)},
		{"reduce_scatter send", adi.InterReduceScatter(ctx, x.ic, []int{1, 2}, []int{1}, []int{1, 2}, adi.Sum)},
		{"reduce_scatter receive", adi.InterReduceScatter(ctx, x.ic, []int{1, 2, 3}, []int{1, 2}, []int{1, 2}, adi.Sum)},
		{"reduce_scatter_block send", adi.InterReduceScatterBlock(ctx, x.ic, []int{1, 2, 3}, []int{1}, adi.Sum)},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		} else if errors.Is(tc.err, adi.ErrMismatch) || errors.Is(tc.err, context.Canceled) {
			t.Errorf("%s: %v, want an argument error", tc.name, tc.err)
		}
	}
}

// TestIntercommAllgathervThreshold: in a group of 8 one rank (world 5,
// which the broadcast passes through to others) cuts its slices to
// another total than its leader's, on the same side of Bcast's 12 KiB
// scatter threshold or across it. That rank, and only it, gets
// ErrMismatch; every other rank of both groups gets its blocks, none
// waits until its ctx ends (the deadline is a guard, not a timing), and
// the intercommunicator still works. Blocking and nonblocking, on one
// host and across hosts.
func TestIntercommAllgathervThreshold(t *testing.T) {
	s := split{"1|8", 9, below(1), nil}
	for _, on := range []struct{ name, hosts string }{{"one host", ""}, {"hosts", "aabbbcccc"}} {
		var hostOf func(int) string
		if on.hosts != "" {
			hostOf = func(r int) string { return on.hosts[r : r+1] }
		}
		xs := intercommsOn(t, s, hostOf)
		// After a failure the intercommunicator may be stuck: the rest
		// of the cases on it would only fail by their deadlines.
	cases:
		for _, tc := range []struct {
			name      string
			good, bad int // world 0's block; world 5's slice for it
		}{
			{"across, down", 13000, 12000},
			{"across, up", 12000, 13000},
			{"both above", 13000, 14000},
			{"both below", 1000, 1100},
		} {
			for _, nb := range []bool{false, true} {
				ok := t.Run(fmt.Sprintf("%s/%s/nonblocking %v", on.name, tc.name, nb), func(t *testing.T) {
					ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
					defer cancel()
					eachIC(t, xs, func(x *icRank) error {
						// Group 0 sends tc.good bytes, group 1 10.
						send, m := pattern(x.me, 0, 10), tc.good
						if x.color == 0 {
							send, m = pattern(x.me, 0, tc.good), 10
						}
						if x.me == 5 {
							m = tc.bad
						}
						recv := make([][]byte, len(x.remote))
						for j := range recv {
							recv[j] = make([]byte, m)
						}
						var err error
						if nb {
							var req *adi.Request
							if req, err = x.ic.Iallgatherv(send, recv); err == nil {
								_, err = req.Wait(ctx)
							}
						} else {
							err = x.ic.Allgatherv(ctx, send, recv)
						}
						switch {
						case x.me == 5 && !errors.Is(err, adi.ErrMismatch):
							return fmt.Errorf("slices of %d bytes for a block of %d: %v, want ErrMismatch", tc.bad, tc.good, err)
						case x.me == 5:
							return nil
						case err != nil:
							return fmt.Errorf("%v, want no error", err)
						}
						for j, wr := range x.remote {
							if want := pattern(wr, 0, m); !bytes.Equal(recv[j], want) {
								return fmt.Errorf("block of remote rank %d differs", j)
							}
						}
						return nil
					})
					eachIC(t, xs, func(x *icRank) error { return x.ic.Barrier(ctx) })
				})
				if !ok {
					break cases
				}
			}
		}
	}
}

// TestIntercommReduceScatterOthersCounts pins what InterReduceScatter's
// doc says of a rank whose counts differ from its leader's in other
// ranks' counts only: no error, and the part the leader's counts give
// it, here at another offset than its own counts say.
func TestIntercommReduceScatterOthersCounts(t *testing.T) {
	xs := intercomms(t, splits[3]) // 2|3
	ctx := ctxT(t)
	const total = 12
	eachIC(t, xs, func(x *icRank) error {
		counts := []int{6, 6}
		if x.color == 1 {
			counts = []int{2, 4, 6}
		}
		if x.me == 3 { // group 1's rank 1: its own count, 4, agrees
			counts = []int{1, 4, 7}
		}
		me := x.ic.Rank()
		got := make([]uint64, counts[me])
		if err := adi.InterReduceScatter(ctx, x.ic, contribution(x.me, total), got, counts, affine); err != nil {
			return fmt.Errorf("counts %v: %v, want no error", counts, err)
		}
		off := 0
		for _, c := range counts[:me] {
			off += c
		}
		if x.me == 3 {
			off = 2 // the leader's counts: 2, 4, 6
		}
		if want := fold(x.remote, total)[off : off+counts[me]]; !equal(got, want) {
			return fmt.Errorf("counts %v: got %x, want %x", counts, got, want)
		}
		return nil
	})
}
