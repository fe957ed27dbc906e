package adi_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// split cuts a job of n ranks into two groups: world rank r is in group
// color(r) (0 or 1), each group ordered by key(r), then by world rank.
type split struct {
	name  string
	n     int
	color func(r int) int
	key   func(r int) int // nil: world rank order
}

// below puts the first k world ranks in group 0, the others in group 1.
func below(k int) func(int) int {
	return func(r int) int {
		if r < k {
			return 0
		}
		return 1
	}
}

func parity(r int) int { return r % 2 }

// splits are the group sizes intercommunicators are tested with: one
// rank each, one against several both ways, uneven and even splits,
// groups interleaved in world rank order, and groups in reverse world
// order, where group 1's leader has the lower world rank.
var splits = []split{
	{"1|1", 2, below(1), nil},
	{"1|3", 4, below(1), nil},
	{"3|1", 4, below(3), nil},
	{"2|3", 5, below(2), nil},
	{"3|3", 6, below(3), nil},
	{"evens|odds", 6, parity, nil},
	{"evens|odds reversed", 7, parity, func(r int) int { return -r }},
}

// members lists the world ranks of group color, in the group's order.
func (s split) members(color int) []int {
	var m []int
	for r := range s.n {
		if s.color(r) == color {
			m = append(m, r)
		}
	}
	if s.key != nil {
		slices.SortStableFunc(m, func(a, b int) int { return cmp.Compare(s.key(a), s.key(b)) })
	}
	return m
}

// icRank is one rank of an intercommunicator test.
type icRank struct {
	world, group *adi.Comm // the world, and its group's communicator from Split
	ic           *adi.Intercomm
	color        int
	me           int   // world rank
	local        []int // world ranks of this rank's group, in order
	remote       []int // and of the other
}

// intercomms starts s's job and builds an intercommunicator between its
// groups on every rank, the leaders being each group's rank 0.
func intercomms(t *testing.T, s split) []*icRank {
	t.Helper()
	return intercommsOn(t, s, nil)
}

// intercommsOn is intercomms with the ranks on the hosts hostOf names
// (nil: one host).
func intercommsOn(t *testing.T, s split, hostOf func(int) string) []*icRank {
	t.Helper()
	ws, _ := loopWorldsOn(t, s.n, hostOf)
	ctx := ctxT(t)
	xs := make([]*icRank, s.n)
	for r := range xs {
		c := s.color(r)
		xs[r] = &icRank{world: ws[r].Comm(), color: c, me: r, local: s.members(c), remote: s.members(1 - c)}
	}
	eachIC(t, xs, func(x *icRank) error {
		key := x.me
		if s.key != nil {
			key = s.key(x.me)
		}
		g, err := x.world.Split(ctx, x.color, key)
		if err != nil {
			return err
		}
		x.group = g
		x.ic, err = g.IntercommCreate(ctx, 0, x.world, x.remote[0], 77)
		return err
	})
	if t.Failed() {
		t.FailNow()
	}
	return xs
}

// eachIC runs f on every rank at once and fails t with every rank's
// error.
func eachIC(t *testing.T, xs []*icRank, f func(x *icRank) error) {
	t.Helper()
	errs := make([]error, len(xs))
	var wg sync.WaitGroup
	for r, x := range xs {
		wg.Go(func() { errs[r] = f(x) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("world rank %d: %v", r, err)
		}
	}
}

// TestIntercommCreate: each rank's intercommunicator has its group as
// the local one, in its communicator's order, and the other as the
// remote one.
func TestIntercommCreate(t *testing.T) {
	for _, s := range splits {
		t.Run(s.name, func(t *testing.T) {
			xs := intercomms(t, s)
			eachIC(t, xs, func(x *icRank) error {
				ic := x.ic
				if ic.Size() != len(x.local) || ic.RemoteSize() != len(x.remote) || ic.Rank() != slices.Index(x.local, x.me) {
					return fmt.Errorf("rank %d of %d, remote size %d; want rank %d of %d, remote size %d",
						ic.Rank(), ic.Size(), ic.RemoteSize(), slices.Index(x.local, x.me), len(x.local), len(x.remote))
				}
				for _, g := range []struct {
					name      string
					got, want []int
				}{
					{"group", ic.Group().WorldRanks(), x.local},
					{"remote group", ic.RemoteGroup().WorldRanks(), x.remote},
					{"local communicator", ic.Local().Group().WorldRanks(), x.local},
				} {
					if !slices.Equal(g.got, g.want) {
						return fmt.Errorf("%s %v, want %v", g.name, g.got, g.want)
					}
				}
				if ic.Local().Rank() != ic.Rank() || ic.Group().Rank() != ic.Rank() || ic.RemoteGroup().Rank() != adi.Undefined {
					return fmt.Errorf("ranks: local communicator %d, group %d, remote group %d", ic.Local().Rank(), ic.Group().Rank(), ic.RemoteGroup().Rank())
				}
				return nil
			})
		})
	}
}

// msg is what world rank src sends world rank dst with tag.
func msg(src, dst, tag int) []byte { return fmt.Appendf(nil, "%d->%d #%d", src, dst, tag) }

// TestIntercommPointToPoint: messages both ways between the groups, to
// and from remote ranks, with wildcards, probes, synchronous sends and
// Sendrecv; statuses name remote ranks.
func TestIntercommPointToPoint(t *testing.T) {
	for _, s := range splits {
		t.Run(s.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			eachIC(t, xs, func(x *icRank) error {
				ic, me := x.ic, ic0(x)
				nr := ic.RemoteSize()
				// To every remote rank, tagged with this rank's local rank;
				// received with both wildcards.
				var sends []*adi.Request
				for j, wr := range x.remote {
					q, err := ic.Isend(msg(x.me, wr, 10+me), j, 10+me)
					if err != nil {
						return err
					}
					sends = append(sends, q)
				}
				seen := make([]bool, nr)
				for range nr {
					buf := make([]byte, 64)
					st, err := ic.Recv(ctx, buf, adi.AnySource, adi.AnyTag)
					if err != nil {
						return err
					}
					if st.Source < 0 || st.Source >= nr || seen[st.Source] {
						return fmt.Errorf("wildcard receive: status %+v", st)
					}
					seen[st.Source] = true
					if want := msg(x.remote[st.Source], x.me, 10+st.Source); st.Tag != 10+st.Source || !bytes.Equal(buf[:st.Count], want) {
						return fmt.Errorf("wildcard receive: %+v %q, want tag %d %q", st, buf[:st.Count], 10+st.Source, want)
					}
				}
				if _, err := adi.WaitAll(ctx, sends...); err != nil {
					return err
				}
				// The wildcard receives above must not see what follows.
				if err := ic.Barrier(ctx); err != nil {
					return err
				}
				// Synchronous sends, received by source and tag, after a
				// probe for any source.
				sends = sends[:0]
				for j, wr := range x.remote {
					q, err := ic.Issend(msg(x.me, wr, 3), j, 3)
					if err != nil {
						return err
					}
					sends = append(sends, q)
				}
				st, err := ic.Probe(ctx, adi.AnySource, 3)
				if err != nil || st.Source < 0 || st.Source >= nr || st.Tag != 3 {
					return fmt.Errorf("probe: %+v %v", st, err)
				}
				if _, ok, err := ic.Iprobe(st.Source, 3); !ok || err != nil {
					return fmt.Errorf("iprobe of remote rank %d after its probe: %v %v", st.Source, ok, err)
				}
				for j := range nr {
					buf := make([]byte, 64)
					q, err := ic.Irecv(buf, j, 3)
					if err != nil {
						return err
					}
					st, err := q.Wait(ctx)
					if want := msg(x.remote[j], x.me, 3); err != nil || st.Source != j || st.Tag != 3 || !bytes.Equal(buf[:st.Count], want) {
						return fmt.Errorf("receive from remote rank %d: %+v %q %v, want %q", j, st, buf[:st.Count], err, want)
					}
				}
				if _, err := adi.WaitAll(ctx, sends...); err != nil {
					return err
				}
				// Sendrecv pairs local rank i with remote rank i, both ways;
				// the ranks without a partner send a blocking Ssend to
				// ProcNull.
				if me < nr {
					buf := make([]byte, 64)
					st, err := ic.Sendrecv(ctx, msg(x.me, x.remote[me], 4), me, 4, buf, me, 4)
					if want := msg(x.remote[me], x.me, 4); err != nil || st.Source != me || !bytes.Equal(buf[:st.Count], want) {
						return fmt.Errorf("sendrecv with remote rank %d: %+v %q %v, want %q", me, st, buf[:st.Count], err, want)
					}
				} else if err := ic.Ssend(ctx, []byte("x"), adi.ProcNull, 4); err != nil {
					return err
				}
				if st, err := ic.Recv(ctx, nil, adi.ProcNull, 4); err != nil || st.Source != adi.ProcNull {
					return fmt.Errorf("receive from ProcNull: %+v %v", st, err)
				}
				// A remote rank that does not exist is an error, not
				// a local rank.
				if err := ic.Send(ctx, nil, nr, 0); !errors.Is(err, adi.ErrRank) {
					return fmt.Errorf("send to remote rank %d of %d: %v, want ErrRank", nr, nr, err)
				}
				if _, err := ic.Irecv(nil, nr, 0); !errors.Is(err, adi.ErrRank) {
					return fmt.Errorf("receive from remote rank %d of %d: %v, want ErrRank", nr, nr, err)
				}
				return nil
			})
		})
	}
}

// ic0 is x's local rank.
func ic0(x *icRank) int { return x.ic.Rank() }

// TestIntercommMerge: the merged communicator puts the group that passed
// high false first; when both pass the same, the group whose leader has
// the lower world rank. Every rank gets the same communicator, which
// carries messages and collectives.
func TestIntercommMerge(t *testing.T) {
	for _, s := range []split{splits[3], splits[5], splits[6]} {
		xs := intercomms(t, s)
		ctx := ctxT(t)
		// The group whose leader has the lower world rank.
		lowLeader := 0
		if s.members(1)[0] < s.members(0)[0] {
			lowLeader = 1
		}
		for _, tc := range []struct {
			high  [2]bool // of groups 0 and 1
			first int     // the group that goes first
		}{
			{[2]bool{false, true}, 0},
			{[2]bool{true, false}, 1},
			{[2]bool{false, false}, lowLeader},
			{[2]bool{true, true}, lowLeader},
		} {
			t.Run(fmt.Sprintf("%s/high=%v", s.name, tc.high), func(t *testing.T) {
				want := append(s.members(tc.first), s.members(1-tc.first)...)
				eachIC(t, xs, func(x *icRank) error {
					m, err := x.ic.Merge(ctx, tc.high[x.color])
					if err != nil {
						return err
					}
					if got := m.Group().WorldRanks(); !slices.Equal(got, want) || m.Rank() != slices.Index(want, x.me) {
						return fmt.Errorf("merged %v as rank %d, want %v as rank %d", got, m.Rank(), want, slices.Index(want, x.me))
					}
					// A ring and a sum over the merged communicator.
					p := m.Size()
					next, prev := (m.Rank()+1)%p, (m.Rank()-1+p)%p
					buf := make([]byte, 64)
					st, err := m.Sendrecv(ctx, msg(x.me, want[next], 1), next, 1, buf, adi.AnySource, adi.AnyTag)
					if err != nil || st.Source != prev || !bytes.Equal(buf[:st.Count], msg(want[prev], x.me, 1)) {
						return fmt.Errorf("ring: %+v %q %v", st, buf[:st.Count], err)
					}
					sum := []int{x.me}
					if err := adi.Allreduce(ctx, m, sum, sum, adi.Sum); err != nil {
						return err
					}
					if sum[0] != s.n*(s.n-1)/2 {
						return fmt.Errorf("sum of world ranks %d, want %d", sum[0], s.n*(s.n-1)/2)
					}
					return nil
				})
			})
		}
	}
}

// TestIntercommCollectives: every collective's result on every rank of
// both groups, with the root in either group.
func TestIntercommCollectives(t *testing.T) {
	for _, s := range splits {
		t.Run(s.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			var arrived [2]atomic.Int32
			t.Run("barrier", func(t *testing.T) {
				eachIC(t, xs, func(x *icRank) error {
					for round := range 3 {
						if x.color == 1 { // group 1 comes late
							for range 200 {
								runtime.Gosched()
							}
						}
						arrived[x.color].Add(1)
						if err := x.ic.Barrier(ctx); err != nil {
							return err
						}
						if got, want := int(arrived[1-x.color].Load()), (round+1)*len(x.remote); got < want {
							return fmt.Errorf("round %d: left the barrier when %d ranks of the other group had arrived, want %d", round, got, want)
						}
					}
					return nil
				})
			})
			for rootColor := range 2 {
				// The root is its group's last rank: not the leader, where
				// the group has more than one.
				rootGroup := s.members(rootColor)
				rootRank, rootWorld := len(rootGroup)-1, rootGroup[len(rootGroup)-1]
				// root is what rank x passes as the root, and whether it is it.
				root := func(x *icRank) (int, bool) {
					switch {
					case x.color != rootColor:
						return rootRank, false
					case x.me == rootWorld:
						return adi.Root, true
					}
					return adi.ProcNull, false
				}
				for _, n := range []int{0, 100, 3000} { // 3000 bytes go by rendezvous
					t.Run(fmt.Sprintf("bcast/root in %d/%d bytes", rootColor, n), func(t *testing.T) {
						eachIC(t, xs, func(x *icRank) error {
							r, isRoot := root(x)
							buf := make([]byte, n)
							if isRoot {
								buf = pattern(rootWorld, 0, n)
							}
							if err := x.ic.Bcast(ctx, buf, r); err != nil {
								return err
							}
							if want := pattern(rootWorld, 0, n); x.color != rootColor && !bytes.Equal(buf, want) {
								return fmt.Errorf("got %v, want %v", buf, want)
							}
							return nil
						})
					})
					t.Run(fmt.Sprintf("gather/root in %d/%d bytes", rootColor, n), func(t *testing.T) {
						eachIC(t, xs, func(x *icRank) error {
							r, isRoot := root(x)
							var recv []byte
							if isRoot {
								recv = make([]byte, len(x.remote)*n)
							}
							if err := x.ic.Gather(ctx, pattern(x.me, rootWorld, n), recv, r); err != nil {
								return err
							}
							if isRoot {
								for j, wr := range x.remote {
									if got, want := recv[j*n:(j+1)*n], pattern(wr, rootWorld, n); !bytes.Equal(got, want) {
										return fmt.Errorf("block of remote rank %d: got %v, want %v", j, got, want)
									}
								}
							}
							return nil
						})
					})
					t.Run(fmt.Sprintf("scatter/root in %d/%d bytes", rootColor, n), func(t *testing.T) {
						eachIC(t, xs, func(x *icRank) error {
							r, isRoot := root(x)
							var send []byte
							if isRoot {
								for _, wr := range x.remote {
									send = append(send, pattern(rootWorld, wr, n)...)
								}
							}
							recv := make([]byte, n)
							if err := x.ic.Scatter(ctx, send, recv, r); err != nil {
								return err
							}
							if want := pattern(rootWorld, x.me, n); x.color != rootColor && !bytes.Equal(recv, want) {
								return fmt.Errorf("got %v, want %v", recv, want)
							}
							return nil
						})
					})
				}
				for _, elems := range []int{0, 1, 700} { // 700 elements: 5600 bytes, rendezvous
					t.Run(fmt.Sprintf("reduce/root in %d/%d elements", rootColor, elems), func(t *testing.T) {
						want := fold(s.members(1-rootColor), elems)
						eachIC(t, xs, func(x *icRank) error {
							r, isRoot := root(x)
							var got []uint64
							if isRoot {
								got = make([]uint64, elems)
							}
							if err := adi.InterReduce(ctx, x.ic, contribution(x.me, elems), got, affine, r); err != nil {
								return err
							}
							if isRoot && !equal(got, want) {
								return fmt.Errorf("got %x, want %x", got, want)
							}
							return nil
						})
					})
				}
			}
			for _, elems := range []int{0, 1, 700} {
				t.Run(fmt.Sprintf("allreduce/%d elements", elems), func(t *testing.T) {
					eachIC(t, xs, func(x *icRank) error {
						got := make([]uint64, elems)
						if err := adi.InterAllreduce(ctx, x.ic, contribution(x.me, elems), got, affine); err != nil {
							return err
						}
						if want := fold(x.remote, elems); !equal(got, want) {
							return fmt.Errorf("got %x, want the other group's %x", got, want)
						}
						// In place, with a predefined operation.
						v := make([]int64, elems)
						for i := range v {
							v[i] = int64(x.me*elems + i)
						}
						if err := adi.InterAllreduce(ctx, x.ic, v, v, adi.Sum); err != nil {
							return err
						}
						for i := range v {
							var want int64
							for _, wr := range x.remote {
								want += int64(wr*elems + i)
							}
							if v[i] != want {
								return fmt.Errorf("in place, element %d: got %d, want %d", i, v[i], want)
							}
						}
						return nil
					})
				})
			}
			// Each group's blocks have a length of their own: n(color).
			for _, base := range []int{0, 5, 700} {
				n := func(color int) int { return base + 2*color }
				t.Run(fmt.Sprintf("allgather/%d and %d bytes", n(0), n(1)), func(t *testing.T) {
					eachIC(t, xs, func(x *icRank) error {
						m := n(1 - x.color)
						recv := make([]byte, len(x.remote)*m)
						if err := x.ic.Allgather(ctx, pattern(x.me, 0, n(x.color)), recv); err != nil {
							return err
						}
						for j, wr := range x.remote {
							if got, want := recv[j*m:(j+1)*m], pattern(wr, 0, m); !bytes.Equal(got, want) {
								return fmt.Errorf("block of remote rank %d: got %v, want %v", j, got, want)
							}
						}
						return nil
					})
				})
				t.Run(fmt.Sprintf("alltoall/%d and %d bytes", n(0), n(1)), func(t *testing.T) {
					eachIC(t, xs, func(x *icRank) error {
						var send []byte
						for _, wr := range x.remote {
							send = append(send, pattern(x.me, wr, n(x.color))...)
						}
						m := n(1 - x.color)
						recv := make([]byte, len(x.remote)*m)
						if err := x.ic.Alltoall(ctx, send, recv); err != nil {
							return err
						}
						for j, wr := range x.remote {
							if got, want := recv[j*m:(j+1)*m], pattern(wr, x.me, m); !bytes.Equal(got, want) {
								return fmt.Errorf("block from remote rank %d: got %v, want %v", j, got, want)
							}
						}
						return nil
					})
				})
			}
		})
	}
}

// fold is what the contributions of the world ranks in group, in that
// order, combine to under affine.
func fold(group []int, elems int) []uint64 {
	acc := contribution(group[0], elems)
	for _, wr := range group[1:] {
		affine(acc, contribution(wr, elems))
	}
	return acc
}

// TestIntercommIsolation: the intercommunicator's point-to-point
// messages and collectives, those of its Dup, and those on the world,
// the groups' communicators and Local, all with the same tag, never match
// each other's receives, wildcards included.
func TestIntercommIsolation(t *testing.T) {
	for _, s := range []split{splits[3], splits[6]} {
		t.Run(s.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			const tag = 5
			eachIC(t, xs, func(x *icRank) error {
				dup, err := x.ic.Dup(ctx)
				if err != nil {
					return err
				}
				if !slices.Equal(dup.RemoteGroup().WorldRanks(), x.remote) || dup.Rank() != x.ic.Rank() {
					return fmt.Errorf("dup: remote group %v, rank %d", dup.RemoteGroup().WorldRanks(), dup.Rank())
				}
				// Wildcard receives on every channel, posted before any
				// traffic: the intercommunicators' take one message from
				// each remote rank, the others one from their ring.
				type channel struct {
					name  string
					reqs  []*adi.Request
					bufs  [][]byte
					from  func(st adi.Status) int // world rank of a status's source
					count int
				}
				post := func(name string, count int, irecv func([]byte) (*adi.Request, error), from func(adi.Status) int) (*channel, error) {
					ch := &channel{name: name, from: from, count: count}
					for range count {
						b := make([]byte, 64)
						q, err := irecv(b)
						if err != nil {
							return nil, err
						}
						ch.reqs, ch.bufs = append(ch.reqs, q), append(ch.bufs, b)
					}
					return ch, nil
				}
				anyOn := func(recv func([]byte, int, int) (*adi.Request, error)) func([]byte) (*adi.Request, error) {
					return func(b []byte) (*adi.Request, error) { return recv(b, adi.AnySource, adi.AnyTag) }
				}
				remoteWorld := func(st adi.Status) int { return x.remote[st.Source] }
				localWorld := func(st adi.Status) int { return x.local[st.Source] }
				var chans []*channel
				for _, c := range []struct {
					name  string
					count int
					recv  func([]byte, int, int) (*adi.Request, error)
					from  func(adi.Status) int
				}{
					{"intercomm", len(x.remote), x.ic.Irecv, remoteWorld},
					{"dup", len(x.remote), dup.Irecv, remoteWorld},
					{"world", 1, x.world.Irecv, func(st adi.Status) int { return st.Source }},
					{"group", 1, x.group.Irecv, localWorld},
					{"local", 1, x.ic.Local().Irecv, localWorld},
				} {
					ch, err := post(c.name, c.count, anyOn(c.recv), c.from)
					if err != nil {
						return err
					}
					chans = append(chans, ch)
				}
				// Collectives on the intercommunicators and on the groups'
				// communicators.
				v := []int{x.me}
				if err := adi.InterAllreduce(ctx, x.ic, v, v, adi.Sum); err != nil {
					return err
				}
				if err := dup.Barrier(ctx); err != nil {
					return err
				}
				root := 0 // group 0's leader broadcasts
				if x.color == 0 {
					root = map[bool]int{true: adi.Root, false: adi.ProcNull}[x.ic.Rank() == 0]
				}
				if err := x.ic.Bcast(ctx, make([]byte, 8), root); err != nil {
					return err
				}
				if err := x.ic.Alltoall(ctx, make([]byte, 3*len(x.remote)), make([]byte, 3*len(x.remote))); err != nil {
					return err
				}
				if _, err := x.ic.Merge(ctx, false); err != nil {
					return err
				}
				if err := x.group.Barrier(ctx); err != nil {
					return err
				}
				if err := x.ic.Local().Barrier(ctx); err != nil {
					return err
				}
				for _, ch := range chans {
					for _, q := range ch.reqs {
						if st, done, _ := q.Test(); done {
							return fmt.Errorf("%s: a wildcard receive took a collective's message: %+v", ch.name, st)
						}
					}
				}
				// Now one message on each channel, the same tag on all, once
				// every rank has checked its receives.
				if err := x.world.Barrier(ctx); err != nil {
					return err
				}
				me := x.ic.Rank()
				next := x.local[(me+1)%len(x.local)]
				for j, wr := range x.remote {
					if err := x.ic.Send(ctx, msg(x.me, wr, 1), j, tag); err != nil {
						return err
					}
					if err := dup.Send(ctx, msg(x.me, wr, 2), j, tag); err != nil {
						return err
					}
				}
				sends := []struct {
					c    *adi.Comm
					to   int // rank in c
					wr   int // its world rank
					kind int
				}{
					{x.world, (x.me + 1) % s.n, (x.me + 1) % s.n, 3},
					{x.group, (me + 1) % len(x.local), next, 4},
					{x.ic.Local(), (me + 1) % len(x.local), next, 5},
				}
				for _, sd := range sends {
					if err := sd.c.Send(ctx, msg(x.me, sd.wr, sd.kind), sd.to, tag); err != nil {
						return err
					}
				}
				for kind, ch := range chans {
					for i, q := range ch.reqs {
						st, err := q.Wait(ctx)
						if err != nil {
							return fmt.Errorf("%s: %w", ch.name, err)
						}
						if want := msg(ch.from(st), x.me, kind+1); st.Tag != tag || !bytes.Equal(ch.bufs[i][:st.Count], want) {
							return fmt.Errorf("%s: got %+v %q, want %q", ch.name, st, ch.bufs[i][:st.Count], want)
						}
					}
				}
				return nil
			})
		})
	}
}

// TestIntercommCreateErrors: bad arguments and overlapping groups fail on
// every rank of the group, each with the leader's sentinel, and the group
// never waits for the other side to find out.
func TestIntercommCreateErrors(t *testing.T) {
	const n = 5
	s := splits[3] // 2|3
	for _, tc := range []struct {
		name string
		// create is what rank x of group 0 calls; group 1 calls nothing.
		create func(ctx context.Context, x *icRank) (*adi.Intercomm, error)
		want   error  // on every rank of group 0; nil: any error
		text   string // in every rank's error
	}{
		{"local leader out of range", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			return x.group.IntercommCreate(ctx, 2, x.world, 2, 77)
		}, adi.ErrRank, ""},
		{"remote leader out of range", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			return x.group.IntercommCreate(ctx, 0, x.world, n, 77)
		}, adi.ErrRank, ""},
		{"remote leader is the local leader", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			return x.group.IntercommCreate(ctx, 1, x.world, 1, 77)
		}, adi.ErrRank, ""},
		{"remote leader in the local group", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			return x.group.IntercommCreate(ctx, 0, x.world, 1, 77)
		}, adi.ErrGroupsOverlap, ""},
		{"bad tag", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			return x.group.IntercommCreate(ctx, 0, x.world, 2, -5)
		}, adi.ErrTag, ""},
		{"no peer", func(ctx context.Context, x *icRank) (*adi.Intercomm, error) {
			return x.group.IntercommCreate(ctx, 0, nil, 2, 77)
		}, nil, "bad peer communicator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			xs := intercomms(t, s)
			ctx := ctxT(t)
			eachIC(t, xs[:2], func(x *icRank) error {
				ic, err := tc.create(ctx, x)
				switch {
				case err == nil:
					return fmt.Errorf("no error (%v)", ic)
				case tc.want != nil && !errors.Is(err, tc.want):
					return fmt.Errorf("%v, want %v", err, tc.want)
				case !strings.Contains(err.Error(), tc.text):
					return fmt.Errorf("%v, want it to say %q", err, tc.text)
				}
				return nil
			})
		})
	}
	// Groups {0, 1} and {1, 2}: world rank 1 takes part in both, from two
	// goroutines; both leaders find the overlap and tell their groups.
	t.Run("groups overlap", func(t *testing.T) {
		cs := loopJob(t, 3)
		ctx := ctxT(t)
		groupOf := func(c *adi.Comm, ranks []int) *adi.Comm {
			g, err := c.Group().Incl(ranks)
			if err != nil {
				t.Fatal(err)
			}
			cg, err := c.CreateGroup(ctx, g, 1)
			if err != nil {
				t.Error(err)
			}
			return cg
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for _, g := range []struct {
			ranks  []int
			remote int
		}{{[]int{0, 1}, 2}, {[]int{2, 1}, 0}} {
			for _, r := range g.ranks {
				wg.Go(func() {
					c := groupOf(cs[r], g.ranks)
					if c == nil {
						return
					}
					_, err := c.IntercommCreate(ctx, 0, cs[r], g.remote, 9)
					if !errors.Is(err, adi.ErrGroupsOverlap) {
						err = fmt.Errorf("world rank %d of group %v: %v, want ErrGroupsOverlap", r, g.ranks, err)
					} else {
						err = nil
					}
					errs <- err
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})
	// A leader that finds a message of the program's with its tag in place
	// of the handshake says so, and so does its group; the other group,
	// left waiting for the groups, ends with its ctx.
	t.Run("tag taken", func(t *testing.T) {
		xs := intercomms(t, s)
		ctx, cancel := context.WithCancel(ctxT(t))
		defer cancel()
		if err := xs[0].world.Send(ctx, make([]byte, 24), 2, 77); err != nil {
			t.Fatal(err)
		}
		var left sync.WaitGroup
		left.Add(3)
		go func() { left.Wait(); cancel() }()
		eachIC(t, xs, func(x *icRank) error {
			_, err := x.group.IntercommCreate(ctx, 0, x.world, x.remote[0], 77)
			if x.color == 1 {
				left.Done()
				if !errors.Is(err, adi.ErrMismatch) {
					return fmt.Errorf("%v, want ErrMismatch", err)
				}
			} else if !errors.Is(err, context.Canceled) {
				return fmt.Errorf("%v, want the context's end", err)
			}
			return nil
		})
	})
	// A group whose peer never comes returns when its ctx ends.
	t.Run("ctx ends", func(t *testing.T) {
		xs := intercomms(t, s)
		ctx, cancel := context.WithCancel(ctxT(t))
		go func() {
			// Once the leader is in the exchange, which it never leaves.
			for {
				if _, ok, _ := xs[2].world.Iprobe(0, 78); ok {
					break
				}
				runtime.Gosched()
			}
			cancel()
		}()
		eachIC(t, xs[:2], func(x *icRank) error {
			if _, err := x.group.IntercommCreate(ctx, 0, x.world, 2, 78); !errors.Is(err, context.Canceled) {
				return fmt.Errorf("%v, want the context's end", err)
			}
			return nil
		})
	})
}

// TestIntercommCollectiveErrors: disagreeing lengths and highs reach
// every rank of both groups as ErrMismatch; a bad root or buffers fail
// locally.
func TestIntercommCollectiveErrors(t *testing.T) {
	xs := intercomms(t, splits[6]) // 4|3, reversed
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		f    func(x *icRank) error
	}{
		{"allreduce lengths differ between the groups", func(x *icRank) error {
			v := make([]int, 1+x.color)
			return adi.InterAllreduce(ctx, x.ic, v, v, adi.Sum)
		}},
		{"allreduce lengths differ within a group", func(x *icRank) error {
			v := make([]int, 1)
			if x.me == 2 {
				v = make([]int, 2)
			}
			return adi.InterAllreduce(ctx, x.ic, v, v, adi.Sum)
		}},
		{"allgather lengths differ within a group", func(x *icRank) error {
			send := make([]byte, 2)
			if x.me == 5 {
				send = make([]byte, 3)
			}
			return x.ic.Allgather(ctx, send, make([]byte, 2*len(x.remote)))
		}},
		{"merge highs differ within a group", func(x *icRank) error {
			_, err := x.ic.Merge(ctx, x.me == 4)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachIC(t, xs, func(x *icRank) error {
				err := tc.f(x)
				if !errors.Is(err, adi.ErrMismatch) {
					return fmt.Errorf("%v, want ErrMismatch", err)
				}
				// A rank that is no leader hears of it from its own
				// leader, and the error says the rank it names is local.
				if x.ic.Rank() != 0 && !strings.Contains(err.Error(), "local group") {
					return fmt.Errorf("%v, want it to say the rank it names is of the local group", err)
				}
				return nil
			})
			// The intercommunicator still works.
			eachIC(t, xs, func(x *icRank) error { return x.ic.Barrier(ctx) })
		})
	}
	t.Run("bcast lengths differ", func(t *testing.T) {
		eachIC(t, xs, func(x *icRank) error {
			root := 0
			if x.color == 0 {
				root = map[bool]int{true: adi.Root, false: adi.ProcNull}[x.ic.Rank() == 0]
			}
			err := x.ic.Bcast(ctx, make([]byte, 4+x.color), root)
			if x.color == 1 && !errors.Is(err, adi.ErrMismatch) {
				return fmt.Errorf("receiving group: %v, want ErrMismatch", err)
			}
			return nil
		})
	})
	t.Run("arguments", func(t *testing.T) {
		x := xs[0]
		for _, tc := range []struct {
			name string
			err  error
		}{
			{"bcast root", x.ic.Bcast(ctx, nil, len(x.remote))},
			{"gather root", x.ic.Gather(ctx, nil, nil, -7)},
			{"reduce root", adi.InterReduce(ctx, x.ic, []int{1}, []int{1}, adi.Sum, len(x.remote))},
			{"allreduce lengths", adi.InterAllreduce(ctx, x.ic, []int{1}, []int{1, 2}, adi.Sum)},
			{"allgather receive buffer", x.ic.Allgather(ctx, []byte{1}, make([]byte, len(x.remote)+1))},
			{"alltoall buffers", x.ic.Alltoall(ctx, make([]byte, len(x.remote)+1), make([]byte, len(x.remote)))},
		} {
			if tc.err == nil {
				t.Errorf("%s: no error", tc.name)
			}
		}
	})
}

// TestIntercommBadRankSaysRemote: a rank out of range in an Intercomm's
// point-to-point call is one of the remote group, whose size is not the
// Intercomm's Size, and the error says so; it read only "destination: 3
// not in [0,3)" on a 2-rank group talking to a 3-rank one.
func TestIntercommBadRankSaysRemote(t *testing.T) {
	xs := intercomms(t, split{"2|3", 5, below(2), nil})
	ic := xs[0].ic
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"send", func() error { return ic.Send(ctxT(t), []byte("x"), 3, 1) }},
		{"irecv", func() error { _, err := ic.Irecv(make([]byte, 1), 3, 1); return err }},
	} {
		err := tc.call()
		if !errors.Is(err, adi.ErrRank) || !strings.Contains(fmt.Sprint(err), "remote group") {
			t.Errorf("%s of rank 3 with 3 remote ranks: %v; want ErrRank naming the remote group", tc.name, err)
		}
	}
}

// TestIntercommMergeMismatchSaysHigh: when one group's ranks disagree on
// Merge's high, the other group, whose ranks agreed, learns it as a
// message of another length from its leader; its error names high and
// the remote group, where it read "0 bytes where 1 were expected (rank 0
// passed another length...)" on a call that passes no length.
func TestIntercommMergeMismatchSaysHigh(t *testing.T) {
	xs := intercomms(t, split{"2|3", 5, below(2), nil})
	ctx := ctxT(t)
	errs := make([]error, len(xs))
	eachIC(t, xs, func(x *icRank) error { // world 0 passes true, world 1 false; 2..4 all false
		_, errs[x.me] = x.ic.Merge(ctx, x.me == 0)
		return nil
	})
	for r := range errs {
		if !errors.Is(errs[r], adi.ErrMismatch) {
			t.Errorf("world %d: %v, want ErrMismatch", r, errs[r])
		}
	}
	for r := 2; r < 5; r++ {
		if !strings.Contains(fmt.Sprint(errs[r]), "remote group's ranks disagree on high") {
			t.Errorf("world %d (its group agreed on high): %v", r, errs[r])
		}
	}
}
