package adi

import (
	"context"
	"fmt"
	"slices"
)

// Cart is a communicator whose ranks are laid out on a Cartesian grid
// (MPI_Cart_create): rank r sits at the coordinates of r in row-major
// order, the last dimension varying fastest. Its ranks are those of the
// communicator it was made from, in the same order unless it was made
// with Reorder. All the methods of Comm apply to it, and the neighbour
// collectives (topo.go) exchange with the ranks one step along each
// dimension.
type Cart struct {
	*Comm
	dims     []int
	periodic []bool
	nb       neighbors
}

// CartCreate makes a Cartesian communicator of the first prod(dims) ranks
// of c, with dimension i wrapping around where periodic[i] is set. It is
// collective: every rank of c calls it with the same arguments; ranks
// beyond the grid get nil. Ranks that pass other arguments than the rest
// all get an error wrapping ErrMismatch. DimsCreate chooses balanced dims.
//
// With Reorder, the ranks of the grid are those same ranks of c, but
// which of them sits at which position (which takes which rank of the
// Cart) is chosen so that neighbours on the grid share a host where they
// can, and a site where they cannot: the grid is cut into blocks of the
// sizes of the hosts (sites first), and the numbering of c is kept where
// it does at least as well. Round-robin placement of a ring of 8 on two
// hosts has all 8 ring edges between the hosts; reordered, 2. Every rank
// computes the numbering alike from the hosts and sites it knows since
// Init, so Reorder costs no more messages than the call without it, but
// some computing on every rank before the Split, near-linear in the
// number of positions (about a quarter of a second for a 200x200 grid on
// 1250 hosts, on one core); it checks ctx as it goes and returns ctx's
// error once ctx ends. A rank finds its position from its new Rank, with
// Coords.
//
// Reorder trades reductions for halos: where the new numbering differs,
// each host's ranks are a block of the grid, as a rule not consecutive
// ranks, and Reduce and Allreduce on the Cart then go flat instead of
// host by host (hostcoll.go; Barrier and Bcast still go by hosts). A program
// that reduces much and exchanges halos little can make its reductions
// on c, whose numbering is the launcher's, or leave Reorder out.
func (c *Comm) CartCreate(ctx context.Context, dims []int, periodic []bool, opts ...TopoOption) (*Cart, error) {
	cfg := topoOptions(opts)
	n, bad := c.gridSize(dims, periodic)
	if bad == nil && cfg.weighted {
		bad = fmt.Errorf("adi: cart create: weights are for a dist graph; a grid's edges are all alike")
	}
	color, key := 0, c.Rank()
	switch {
	case c.Rank() >= n:
		color = Undefined
	case bad == nil && cfg.reorder:
		// A reorder cut short fails this rank's part, but the rank still
		// takes part in the agreement, as one with bad arguments does,
		// so that the others' collectives on c stay in step with its.
		procOf, err := placementOf(c, n).mapGrid(ctx, dims, periodic)
		if err != nil {
			bad = fmt.Errorf("adi: cart create: reorder: %w", err)
			break
		}
		key = slices.Index(procOf, c.Rank())
	}
	sub, err := c.splitAgreed(ctx, "cart create", color, key, sumInts(dims, bits01(periodic), bits01([]bool{cfg.reorder, cfg.weighted})), bad)
	if err != nil || sub == nil {
		return nil, err
	}
	return newCart(sub, slices.Clone(dims), slices.Clone(periodic))
}

// gridSize checks CartCreate's arguments and returns the number of ranks
// on the grid.
func (c *Comm) gridSize(dims []int, periodic []bool) (int, error) {
	if len(periodic) != len(dims) {
		return 0, fmt.Errorf("adi: cart create: %d periodic flags for %d dimensions", len(periodic), len(dims))
	}
	n := 1
	for i, d := range dims {
		if d <= 0 {
			return 0, fmt.Errorf("adi: cart create: dimension %d has %d ranks", i, d)
		}
		// Tested before multiplying: a product past MaxInt would wrap
		// and pass for a grid that fits.
		if d > c.Size()/n {
			return 0, fmt.Errorf("adi: cart create: a grid of %v needs more than the communicator's %d ranks", dims, c.Size())
		}
		n *= d
	}
	return n, nil
}

// newCart lays sub out on a grid of dims, which it keeps.
func newCart(sub *Comm, dims []int, periodic []bool) (*Cart, error) {
	t := &Cart{Comm: sub, dims: dims, periodic: periodic}
	nb, err := cartNeighbors(t)
	if err != nil {
		return nil, err
	}
	t.nb = nb
	return t, nil
}

// Sub partitions t into grids of lower dimension (MPI_Cart_sub): the
// dimensions where remain is set are kept, and the ranks that share their
// coordinates in the others form one grid, of those dimensions, with
// their periodicity, ranks in the same order as in t. With no dimension
// kept every rank is a grid of its own, of no dimensions. It is
// collective: every rank of t calls it with the same remain, and ranks
// that pass another all get an error wrapping ErrMismatch.
func (t *Cart) Sub(ctx context.Context, remain []bool) (*Cart, error) {
	var bad error
	if len(remain) != len(t.dims) {
		bad = fmt.Errorf("adi: cart sub: %d remain flags for %d dimensions", len(remain), len(t.dims))
	}
	color := 0 // this rank's coordinates in the dropped dimensions, row-major
	var dims []int
	var periodic []bool
	if bad == nil {
		me, err := t.Coords(t.Rank())
		if err != nil {
			return nil, err
		}
		for i, keep := range remain {
			if keep {
				dims = append(dims, t.dims[i])
				periodic = append(periodic, t.periodic[i])
			} else {
				color = color*t.dims[i] + me[i]
			}
		}
	}
	// Ordered by their rank in t, the ranks of one grid are in row-major
	// order of the coordinates they keep, as the grid's ranks must be.
	sub, err := t.splitAgreed(ctx, "cart sub", color, t.Rank(), sumInts(bits01(remain)), bad)
	if err != nil {
		return nil, err
	}
	return newCart(sub, dims, periodic)
}

// Dims returns the number of ranks along each dimension.
func (t *Cart) Dims() []int { return slices.Clone(t.dims) }

// Periodic reports for each dimension whether it wraps around.
func (t *Cart) Periodic() []bool { return slices.Clone(t.periodic) }

// Coords returns the grid coordinates of rank r of t (MPI_Cart_coords).
func (t *Cart) Coords(r int) ([]int, error) {
	if r < 0 || r >= t.Size() {
		return nil, fmt.Errorf("adi: cart coords: %w: %d not in [0,%d)", ErrRank, r, t.Size())
	}
	coords := make([]int, len(t.dims))
	for i := len(t.dims) - 1; i >= 0; i-- {
		coords[i] = r % t.dims[i]
		r /= t.dims[i]
	}
	return coords, nil
}

// RankOf returns the rank at coords (MPI_Cart_rank). A coordinate outside
// its dimension wraps around where the dimension is periodic and is an
// error otherwise.
func (t *Cart) RankOf(coords []int) (int, error) {
	if len(coords) != len(t.dims) {
		return 0, fmt.Errorf("adi: cart rank: %d coordinates for %d dimensions", len(coords), len(t.dims))
	}
	r := 0
	for i, x := range coords {
		d := t.dims[i]
		if x < 0 || x >= d {
			if !t.periodic[i] {
				return 0, fmt.Errorf("adi: cart rank: %w: coordinate %d of dimension %d is outside [0,%d), which does not wrap", ErrRank, x, i, d)
			}
			x = (x%d + d) % d
		}
		r = r*d + x
	}
	return r, nil
}

// Shift returns the ranks this rank receives from and sends to in a shift
// by disp along dimension dim (MPI_Cart_shift): source is disp steps
// back, dest disp steps ahead. Past the edge of a dimension that does not
// wrap either is ProcNull, which Sendrecv and the other point-to-point
// calls take as "nobody":
//
//	src, dst, err := grid.Shift(0, 1)
//	_, err = grid.Sendrecv(ctx, edge, dst, tag, halo, src, tag)
func (t *Cart) Shift(dim, disp int) (source, dest int, err error) {
	if dim < 0 || dim >= len(t.dims) {
		return 0, 0, fmt.Errorf("adi: cart shift: dimension %d of %d", dim, len(t.dims))
	}
	me, err := t.Coords(t.Rank())
	if err != nil {
		return 0, 0, err
	}
	at := func(x int) int {
		if (x < 0 || x >= t.dims[dim]) && !t.periodic[dim] {
			return ProcNull
		}
		c := slices.Clone(me)
		c[dim] = x
		r, _ := t.RankOf(c) // in range, or wrapped
		return r
	}
	return at(me[dim] - disp), at(me[dim] + disp), nil
}

// DimsCreate fills the zero entries of dims with numbers of ranks whose
// product, with the non-zero entries, is n, as close to each other as
// can be and in non-increasing order (MPI_Dims_create): 12 ranks in two
// dimensions give [4 3], 72 give [9 8], 8 in three [2 2 2].
func DimsCreate(n int, dims []int) error {
	if n <= 0 {
		return fmt.Errorf("adi: dims create: %d ranks", n)
	}
	fixed, free := 1, 0
	for i, d := range dims {
		switch {
		case d < 0:
			return fmt.Errorf("adi: dims create: dimension %d is %d", i, d)
		case d == 0:
			free++
		case d > n/fixed: // before fixed wraps past MaxInt (to 0, say)
			return fmt.Errorf("adi: dims create: the dimensions %v hold more than %d ranks", dims, n)
		default:
			fixed *= d
		}
	}
	if n%fixed != 0 {
		return fmt.Errorf("adi: dims create: %d ranks do not divide into the fixed dimensions of %v", n, dims)
	}
	rest := n / fixed
	if free == 0 {
		if rest != 1 {
			return fmt.Errorf("adi: dims create: the dimensions %v hold %d ranks, not %d", dims, fixed, n)
		}
		return nil
	}
	got := balanced(rest, free)
	for i := range dims {
		if dims[i] == 0 {
			dims[i], got = got[0], got[1:]
		}
	}
	return nil
}

// balanced splits n into k factors in non-increasing order whose largest
// and smallest are as close as can be, trying the divisors of n: a greedy
// placement of prime factors gave 72 ranks as 12x6, where 9x8 is there.
func balanced(n, k int) []int {
	var divs []int // of n, largest first
	// d <= n/d, not d*d <= n, which wraps for n near MaxInt.
	for d := 1; d <= n/d; d++ {
		if n%d == 0 {
			divs = append(divs, d)
			if d*d != n {
				divs = append(divs, n/d)
			}
		}
	}
	slices.SortFunc(divs, func(a, b int) int { return b - a })
	var best, cur []int
	// atLeast reports whether d^k >= n: d can be the largest of k
	// factors of n.
	atLeast := func(d, k, n int) bool {
		p := 1
		for range k {
			if p >= (n+d-1)/d {
				return true
			}
			p *= d
		}
		return p >= n
	}
	var search func(n, k, most int)
	search = func(n, k, most int) {
		if k == 1 {
			if n > most {
				return
			}
			cur = append(cur, n)
			if best == nil || cur[0]-n < best[0]-best[len(best)-1] {
				best = slices.Clone(cur)
			}
			cur = cur[:len(cur)-1]
			return
		}
		for _, d := range divs {
			if d > most || n%d != 0 {
				continue
			}
			if !atLeast(d, k, n) {
				break // smaller divisors cannot be the largest factor either
			}
			cur = append(cur, d)
			search(n/d, k-1, d)
			cur = cur[:len(cur)-1]
		}
	}
	search(n, k, n)
	return best
}
