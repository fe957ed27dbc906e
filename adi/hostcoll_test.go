package adi_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// hostJob starts a loopback job with rank r on the host named by the
// r-th letter of hosts.
func hostJob(t *testing.T, hosts string, opts ...adi.Option) ([]*adi.World, []*adi.Comm) {
	t.Helper()
	return siteJob(t, hosts, "", opts...)
}

// siteJob is hostJob with rank r naming the site of the r-th letter of
// sites (none if sites is empty).
func siteJob(t *testing.T, hosts, sites string, opts ...adi.Option) ([]*adi.World, []*adi.Comm) {
	t.Helper()
	ws, _ := loopWorldsEach(t, len(hosts), func(r int) string { return hosts[r : r+1] }, func(r int) []adi.Option {
		if sites == "" {
			return opts
		}
		return append([]adi.Option{adi.WithSite(sites[r : r+1])}, opts...)
	})
	cs := make([]*adi.Comm, len(ws))
	for r, w := range ws {
		cs[r] = w.Comm()
	}
	return ws, cs
}

// TestHostCollectives checks the results of the collectives that go by
// hosts, on placements where hosts' ranks are consecutive (reductions go
// by hosts) and where they are not (reductions stay flat), with every
// root, lengths eager, by rendezvous and past the large-message
// algorithms' thresholds, and a non-commutative operation that any
// combination out of rank order gets wrong.
func TestHostCollectives(t *testing.T) {
	for _, pl := range []struct{ name, hosts, sites string }{
		{"2 hosts of 3", "aaabbb", ""},
		{"uneven blocks", "abbbbcc", ""},
		{"round robin", "ababab", ""},
		{"interleaved", "abaab", ""},
		{"2 hosts of 8", "aaaaaaaabbbbbbbb", ""}, // hosts of 8 ranks: the scatter broadcast within a host
		{"8 hosts of 2", "aabbccddeeffgghh", ""}, // 8 leaders: the scatter broadcast and halving among them
		{"a host of 9 and one of 1", "aaaaaaaaab", ""},
		{"2 sites of 2 hosts of 2", "aabbccdd", "XXXXYYYY"},
		{"3 sites, uneven", "aaabbcdddd", "XXXXXYZZZZ"},
		{"sites interleaved", "aabbccdd", "XXYYXXYY"}, // reductions flat
		{"sites of single hosts", "abcdef", "XXXYYY"},
		{"a site of 1", "aabbbc", "XXXXXY"},
	} {
		_, cs := siteJob(t, pl.hosts, pl.sites)
		n := len(cs)
		ctx := ctxT(t)
		t.Run(pl.name+"/barrier", func(t *testing.T) {
			// The last rank comes late: no rank may leave before it came.
			var in atomic.Int32
			each(t, cs, func(c *adi.Comm) error {
				if c.Rank() == n-1 {
					time.Sleep(20 * time.Millisecond)
				}
				in.Add(1)
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				if got := in.Load(); got != int32(n) {
					return fmt.Errorf("left the barrier when %d of %d ranks had come", got, n)
				}
				return nil
			})
		})
		for _, size := range []int{0, 1, 3000, 20000} {
			for root := range n {
				t.Run(fmt.Sprintf("%s/bcast/len=%d/root=%d", pl.name, size, root), func(t *testing.T) {
					each(t, cs, checkBcast(ctx, size, root))
				})
			}
		}
		for _, elems := range []int{0, 1, 700, 9000} {
			want := contribution(0, elems)
			for r := 1; r < n; r++ {
				affine(want, contribution(r, elems))
			}
			for root := range n {
				t.Run(fmt.Sprintf("%s/reduce/elems=%d/root=%d", pl.name, elems, root), func(t *testing.T) {
					each(t, cs, func(c *adi.Comm) error {
						send := contribution(c.Rank(), elems)
						var got []uint64
						if c.Rank() == root {
							got = send // in place on the root
						}
						if err := adi.Reduce(ctx, c, send, got, affine, root); err != nil {
							return err
						}
						if c.Rank() == root && !equal(got, want) {
							return fmt.Errorf("got %x, want %x", got, want)
						}
						return nil
					})
				})
			}
			t.Run(fmt.Sprintf("%s/allreduce/elems=%d", pl.name, elems), func(t *testing.T) {
				each(t, cs, func(c *adi.Comm) error {
					got := contribution(c.Rank(), elems)
					if err := adi.Allreduce(ctx, c, got, got, affine); err != nil {
						return err
					}
					if !equal(got, want) {
						return fmt.Errorf("got %x, want %x", got, want)
					}
					return nil
				})
			})
		}
		t.Run(pl.name+"/nonblocking", func(t *testing.T) {
			// Three at once, each on a copy of the communicator with views
			// of its own.
			want := contribution(0, 700)
			for r := 1; r < n; r++ {
				affine(want, contribution(r, 700))
			}
			each(t, cs, func(c *adi.Comm) error {
				sum := contribution(c.Rank(), 700)
				buf := make([]byte, 3000)
				if c.Rank() == 1 {
					copy(buf, pattern(1, 0, 3000))
				}
				qa, err := adi.Iallreduce(c, sum, sum, affine)
				if err != nil {
					return err
				}
				qb, err := c.Ibcast(buf, 1)
				if err != nil {
					return err
				}
				qc, err := c.Ibarrier()
				if err != nil {
					return err
				}
				if _, err := adi.WaitAll(ctx, qa, qb, qc); err != nil {
					return err
				}
				if !equal(sum, want) || string(buf) != string(pattern(1, 0, 3000)) {
					return errors.New("wrong result")
				}
				return nil
			})
		})
	}
}

// TestHostCollectivesDerived: communicators made from the world map
// their own ranks onto hosts, consecutive or not.
func TestHostCollectivesDerived(t *testing.T) {
	const hosts = "aaabbbcc"
	ws, cs := hostJob(t, hosts)
	ctx := ctxT(t)
	n := len(cs)
	kinds := []string{"split in reverse", "group rotated", "cart", "split in halves"}
	derived := make([][]*adi.Comm, len(kinds)) // by kind, then by rank in the derived communicator
	for i := range derived {
		derived[i] = make([]*adi.Comm, n)
	}
	each(t, cs, func(c *adi.Comm) error {
		r := c.Rank()
		rev, err := c.Split(ctx, 0, n-r) // hosts c c b b b a a a
		if err != nil {
			return err
		}
		g, err := c.Group().Incl([]int{7, 0, 1, 2, 3, 4, 5, 6}) // hosts c a a a b b b c: not consecutive
		if err != nil {
			return err
		}
		rot, err := c.CreateGroup(ctx, g, 5)
		if err != nil {
			return err
		}
		cart, err := c.CartCreate(ctx, []int{2, 4}, []bool{true, false})
		if err != nil {
			return err
		}
		odd := r%2 == 1 || r > 4 // 1 3 5 6 7: hosts a b b c c
		half, err := c.Split(ctx, boolInt(odd), 0)
		if err != nil {
			return err
		}
		for i, d := range []*adi.Comm{rev, rot, cart.Comm, half} {
			if d != half || odd {
				derived[i][d.Rank()] = d
			}
		}
		return nil
	})
	derived[3] = derived[3][:5]
	for i, sub := range derived {
		m := len(sub)
		want := contribution(0, 9000)
		for r := 1; r < m; r++ {
			affine(want, contribution(r, 9000))
		}
		for root := range m {
			t.Run(fmt.Sprintf("%s/root=%d", kinds[i], root), func(t *testing.T) {
				each(t, sub, func(c *adi.Comm) error {
					got := contribution(c.Rank(), 9000)
					if err := adi.Reduce(ctx, c, got, got, affine, root); err != nil {
						return err
					}
					if c.Rank() == root && !equal(got, want) {
						return errors.New("reduce: wrong result")
					}
					b := make([]byte, 20000)
					if c.Rank() == root {
						copy(b, pattern(root, 1, 20000))
					}
					if err := c.Bcast(ctx, b, root); err != nil {
						return err
					}
					if string(b) != string(pattern(root, 1, 20000)) {
						return errors.New("bcast: wrong result")
					}
					return c.Barrier(ctx)
				})
			})
		}
	}
	// The odd half's leaders (world ranks 1, 3 and 6) combine what their
	// hosts hold: a recursive doubling over three ranks, 4 frames.
	half := derived[3]
	want := contribution(0, 13)
	for r := 1; r < len(half); r++ {
		affine(want, contribution(r, 13))
	}
	before := crossFrames(ws, hosts)
	each(t, half, func(c *adi.Comm) error {
		got := contribution(c.Rank(), 13)
		if err := adi.Allreduce(ctx, c, got, got, affine); err != nil {
			return err
		}
		if !equal(got, want) {
			return fmt.Errorf("got %x, want %x", got, want)
		}
		return nil
	})
	if got := crossFrames(ws, hosts) - before; got != 4 {
		t.Errorf("allreduce of a split communicator: %d frames between hosts, want 4", got)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// crossFrames counts the frames the ranks of a job sent to ranks on
// other hosts.
func crossFrames(ws []*adi.World, hosts string) uint64 {
	var n uint64
	for r, w := range ws {
		for _, s := range w.Stats() {
			if hosts[s.Peer] != hosts[r] {
				n += s.Frames
			}
		}
	}
	return n
}

// TestHostCollectivesCross counts what crosses between hosts: by hosts,
// only the leaders send across, once per step of their algorithm; flat,
// more ranks do. Reductions on a placement whose hosts' ranks are not
// consecutive stay flat. MD_HOST_COLLECTIVES=0 and
// WithHostCollectives(false) both keep everything flat.
func TestHostCollectivesCross(t *testing.T) {
	calls := []struct {
		name string
		f    func(ctx context.Context, c *adi.Comm) error
	}{
		{"barrier", func(ctx context.Context, c *adi.Comm) error { return c.Barrier(ctx) }},
		{"bcast from 0", func(ctx context.Context, c *adi.Comm) error { return c.Bcast(ctx, make([]byte, 8), 0) }},
		{"bcast from 4", func(ctx context.Context, c *adi.Comm) error { return c.Bcast(ctx, make([]byte, 8), 4) }},
		{"reduce to 4", func(ctx context.Context, c *adi.Comm) error {
			return adi.Reduce(ctx, c, make([]int64, 1), make([]int64, 1), adi.Sum, 4)
		}},
		{"allreduce", func(ctx context.Context, c *adi.Comm) error {
			return adi.Allreduce(ctx, c, make([]int64, 1), make([]int64, 1), adi.Sum)
		}},
	}
	count := func(t *testing.T, hosts string, opts ...adi.Option) map[string]uint64 {
		ws, cs := hostJob(t, hosts, opts...)
		ctx := ctxT(t)
		out := make(map[string]uint64)
		for _, call := range calls {
			before := crossFrames(ws, hosts)
			each(t, cs, func(c *adi.Comm) error { return call.f(ctx, c) })
			out[call.name] = crossFrames(ws, hosts) - before
		}
		return out
	}
	// Leaders 0 and 3: a barrier, an allreduce and a reduce (to leader 0,
	// then on to 3) are an exchange; a broadcast one message.
	byHosts := count(t, "aaabbb")
	flat := count(t, "aaabbb", adi.WithHostCollectives(false))
	t.Setenv("MD_HOST_COLLECTIVES", "0")
	flatEnv := count(t, "aaabbb")
	for name, want := range map[string]uint64{"barrier": 2, "bcast from 0": 1, "bcast from 4": 1, "reduce to 4": 2, "allreduce": 2} {
		if byHosts[name] != want {
			t.Errorf("%s by hosts: %d frames between hosts, want %d", name, byHosts[name], want)
		}
		if flat[name] <= want || flatEnv[name] != flat[name] {
			t.Errorf("%s flat: %d frames between hosts with the option, %d with the environment; want as many, more than %d", name, flat[name], flatEnv[name], want)
		}
	}
	t.Setenv("MD_HOST_COLLECTIVES", "")
	mixed := count(t, "ababab")
	mixedFlat := count(t, "ababab", adi.WithHostCollectives(false))
	for _, name := range []string{"reduce to 4", "allreduce"} {
		if mixed[name] != mixedFlat[name] {
			t.Errorf("%s with hosts' ranks apart: %d frames between hosts, %d flat; want it flat", name, mixed[name], mixedFlat[name])
		}
	}
	if mixed["barrier"] >= mixedFlat["barrier"] {
		t.Errorf("barrier with hosts' ranks apart: %d frames between hosts, %d flat; want fewer", mixed["barrier"], mixedFlat["barrier"])
	}
}

// TestSiteCollectivesCross counts what crosses between sites: with sites
// named, only the sites' leaders send across; by hosts alone, every host's
// leader does.
func TestSiteCollectivesCross(t *testing.T) {
	const hosts, sites = "aabbccdd", "XXXXYYYY" // site leaders: ranks 0 and 4
	count := func(sites string) map[string]uint64 {
		ws, cs := siteJob(t, hosts, sites)
		ctx := ctxT(t)
		across := func() uint64 {
			var n uint64
			for r, w := range ws {
				for _, s := range w.Stats() {
					if s.Peer < 4 != (r < 4) {
						n += s.Frames
					}
				}
			}
			return n
		}
		out := make(map[string]uint64)
		for _, call := range []struct {
			name string
			f    func(c *adi.Comm) error
		}{
			{"barrier", func(c *adi.Comm) error { return c.Barrier(ctx) }},
			{"bcast from 5", func(c *adi.Comm) error { return c.Bcast(ctx, make([]byte, 8), 5) }},
			{"reduce to 7", func(c *adi.Comm) error {
				return adi.Reduce(ctx, c, make([]int64, 1), make([]int64, 1), adi.Sum, 7)
			}},
			{"allreduce", func(c *adi.Comm) error {
				return adi.Allreduce(ctx, c, make([]int64, 1), make([]int64, 1), adi.Sum)
			}},
		} {
			before := across()
			each(t, cs, call.f)
			out[call.name] = across() - before
		}
		return out
	}
	// By hosts alone, the hosts' leaders' binomial trees happen to cross
	// once for a broadcast and a reduce too.
	bySites, byHosts := count(sites), count("")
	for name, want := range map[string][2]uint64{"barrier": {2, 6}, "bcast from 5": {1, 1}, "reduce to 7": {2, 2}, "allreduce": {2, 4}} {
		if bySites[name] != want[0] || byHosts[name] != want[1] {
			t.Errorf("%s: %d frames between sites by sites, %d by hosts alone; want %d and %d", name, bySites[name], byHosts[name], want[0], want[1])
		}
	}
	// Not UTF-8: a plugin subdevice's Open, a protobuf string, refused it.
	for _, bad := range []string{"X\x00Y", strings.Repeat("x", 256), "Z\xfcrich"} {
		boots, err := bootstrap.InProcess(1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := adi.Init(ctxT(t), adi.WithBootstrap(boots[0]), adi.WithSite(bad)); err == nil || !strings.Contains(err.Error(), "site") {
			t.Errorf("Init with site %q: %v, want an error about the site", bad, err)
		}
	}
}

// TestSiteRules: sites group hosts, never a host's ranks, and a host's
// site is its first rank's; sites whose hosts are not consecutive leave
// the reductions going by hosts. Each case's reductions must send the
// frames (between hosts, and in all) of the equivalent naming.
func TestSiteRules(t *testing.T) {
	frames := func(hosts, sites string) (across, all uint64) {
		ws, cs := siteJob(t, hosts, sites)
		ctx := ctxT(t)
		each(t, cs, func(c *adi.Comm) error {
			v := make([]int64, 1)
			if err := adi.Allreduce(ctx, c, v, v, adi.Sum); err != nil {
				return err
			}
			return adi.Reduce(ctx, c, v, v, adi.Sum, 1)
		})
		for _, w := range ws {
			for _, s := range w.Stats() {
				all += s.Frames
			}
		}
		return crossFrames(ws, hosts), all
	}
	for _, tc := range []struct{ name, hosts, sites, same string }{
		{"one host in two sites", "aaaaaa", "XXXYYY", ""},
		{"a host's ranks disagree", "aabbcc", "XYXYYY", "XXXXYY"},
		// Reductions by hosts, as without sites.
		{"sites interleaved", "aaaabbbbccccdddd", "XXXXYYYYXXXXYYYY", ""},
	} {
		gotAcross, gotAll := frames(tc.hosts, tc.sites)
		wantAcross, wantAll := frames(tc.hosts, tc.same)
		if gotAcross != wantAcross || gotAll != wantAll {
			t.Errorf("%s: %d frames between hosts, %d in all; want %d and %d, as with sites %q", tc.name, gotAcross, gotAll, wantAcross, wantAll, tc.same)
		}
	}
}

func TestHostCollectivesEnv(t *testing.T) {
	t.Setenv("MD_HOST_COLLECTIVES", "sometimes")
	boots, err := bootstrap.InProcess(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = adi.Init(ctxT(t), adi.WithBootstrap(boots[0]))
	if err == nil || !strings.Contains(err.Error(), `MD_HOST_COLLECTIVES="sometimes"`) {
		t.Fatalf("Init with MD_HOST_COLLECTIVES=sometimes: %v, want an error naming it", err)
	}
}

// TestHostCollectivesMismatch: a rank that passes another length is
// found out by hosts too, and the ranks whose results depend on it hear
// of it; every rank returns.
func TestHostCollectivesMismatch(t *testing.T) {
	_, cs := hostJob(t, "aaabbb")
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		odd  int
		f    func(c *adi.Comm, size int) error
		want []bool
	}{
		// Rank 4 short: host b's leader 3 finds out, tells leader 0, and
		// each leader its host.
		{"allreduce", 4, func(c *adi.Comm, size int) error {
			v := make([]byte, size)
			return adi.Allreduce(ctx, c, v, v, adi.BOr)
		}, []bool{true, true, true, true, true, true}},
		// From 1: host a first (1 -> 0, 1 -> 2 down a tree from 1), then
		// 0 -> 3, then 3 -> 4, 3 -> 5. Rank 2 short hears nothing wrong
		// from 1 but sends nothing on.
		{"bcast", 2, func(c *adi.Comm, size int) error { return c.Bcast(ctx, make([]byte, size), 1) },
			[]bool{false, false, true, false, false, false}},
		{"bcast", 0, func(c *adi.Comm, size int) error { return c.Bcast(ctx, make([]byte, size), 1) },
			[]bool{true, false, false, true, true, true}},
	} {
		for _, size := range []int{64, 4096} {
			errs := make([]error, len(cs))
			each(t, cs, func(c *adi.Comm) error {
				s := size
				if c.Rank() == tc.odd {
					s = size / 2
				}
				errs[c.Rank()] = tc.f(c, s)
				return nil
			})
			for r, want := range tc.want {
				if got := errors.Is(errs[r], adi.ErrMismatch); got != want || !want && errs[r] != nil {
					t.Errorf("%s of %d bytes, rank %d short: rank %d: %v; want ErrMismatch: %v", tc.name, size, tc.odd, r, errs[r], want)
				}
			}
		}
	}
}
