package adi_test

import (
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
)

// FuzzGroupRanges feeds Incl, Excl, RangeIncl and RangeExcl arbitrary
// ranks and ranges (strides near the limits of int among them): they must
// return an error or a group of distinct ranks of the original, never
// panic or loop.
func FuzzGroupRanges(f *testing.F) {
	cs := loopJob(f, 7)
	world := cs[0].Group()
	f.Add(0, 6, 2, 5, 0, -2, 3)
	f.Add(5, 6, int(^uint(0)>>1), 0, 0, 1, -1)
	f.Add(6, 0, -int(^uint(0)>>1)-1, 1, 1, 0, 9)
	f.Fuzz(func(t *testing.T, first, last, stride, first2, last2, stride2, extra int) {
		ranges := []adi.Range{{first, last, stride}, {first2, last2, stride2}}
		check := func(op string, g adi.Group, err error) {
			if err != nil {
				return
			}
			seen := map[int]bool{}
			for _, wr := range g.WorldRanks() {
				if wr < 0 || wr >= world.Size() || seen[wr] {
					t.Fatalf("%s(%v) = %v", op, ranges, g.WorldRanks())
				}
				seen[wr] = true
			}
		}
		g, err := world.RangeIncl(ranges)
		check("RangeIncl", g, err)
		g, err = world.RangeExcl(ranges)
		check("RangeExcl", g, err)
		g, err = world.Incl([]int{first, last, extra})
		check("Incl", g, err)
		g, err = world.Excl([]int{stride, extra})
		check("Excl", g, err)
	})
}
