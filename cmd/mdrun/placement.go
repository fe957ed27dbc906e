package main

import "fmt"

// mapBy is how -map-by places the ranks on the hosts, in Open MPI's
// names (mpirun --map-by).
type mapBy int

const (
	// mapBySlot fills each host's slots with consecutive ranks before
	// the next host's (block placement, Hydra's and mpirun's default).
	mapBySlot mapBy = iota
	// mapByNode deals the ranks out one per host in turn, skipping hosts
	// whose slots are full (round-robin, mpirun --map-by node).
	mapByNode
)

// parseMapBy reads -map-by's value.
func parseMapBy(s string) (mapBy, error) {
	switch s {
	case "slot":
		return mapBySlot, nil
	case "node":
		return mapByNode, nil
	}
	return mapBySlot, fmt.Errorf("-map-by %q: want slot or node", s)
}

func (m mapBy) String() string {
	return [...]string{"slot", "node"}[m]
}

// place gives each of n ranks a host as m says; see placeRanks and
// placeByNode.
func place(n int, hosts []hostSpec, m mapBy) []string {
	if m == mapByNode {
		return placeByNode(n, hosts)
	}
	return placeRanks(n, hosts)
}

// placeByNode gives each rank a host round-robin: rank 0 the first host,
// rank 1 the second, and so on, a host whose slots are full being
// skipped, until every host's slots are full. With more ranks than slots
// in all, that starts over with every host's slots free again, as
// placeRanks starts the list over: each round places the same number of
// ranks on a host under either policy. A host listed more than once is
// one host with the slots of all its entries, where its first entry is,
// as mpirun counts a host a hostfile repeats: round-robin is over hosts,
// not over lines. hosts must not be empty.
func placeByNode(n int, hosts []hostSpec) []string {
	merged := mergeHosts(hosts)
	out := make([]string, 0, n)
	for len(out) < n {
		// One round. open holds the hosts with free slots, in list
		// order; a sweep places one rank on each and drops the full
		// ones, so a round costs its ranks plus the hosts, however
		// uneven the slots.
		open := append([]hostSpec(nil), merged...)
		for len(open) > 0 && len(out) < n {
			kept := open[:0]
			for _, h := range open {
				if len(out) == n {
					break
				}
				out = append(out, h.name)
				if h.slots--; h.slots > 0 {
					kept = append(kept, h)
				}
			}
			open = kept
		}
	}
	return out
}

// mergeHosts returns hosts with each name once, where it first appears,
// with the slots of all its entries (at most maxSlots per entry, so the
// sum fits an int). The site is the same in every entry: sameSite saw to
// that.
func mergeHosts(hosts []hostSpec) []hostSpec {
	at := map[string]int{}
	var out []hostSpec
	for _, h := range hosts {
		if i, ok := at[h.name]; ok {
			out[i].slots += h.slots
			continue
		}
		at[h.name] = len(out)
		out = append(out, h)
	}
	return out
}

// checkPPN reads -ppn N, Hydra's processes per node, into hosts: every
// host that gives no slots of its own gets N. One that gives its own is
// an error rather than a guess at which count was meant. hosts is
// changed in place; ppnGiven says -ppn was on the command line.
func checkPPN(ppn int, ppnGiven bool, hosts []hostSpec) error {
	if !ppnGiven {
		return nil
	}
	if ppn < 1 || ppn > maxSlots {
		return fmt.Errorf("-ppn %d: want a number of ranks per host from 1 to %d", ppn, maxSlots)
	}
	if hosts == nil {
		return fmt.Errorf("-ppn %d: give -hosts or -hostfile too: without them every rank runs on this machine", ppn)
	}
	for i := range hosts {
		if hosts[i].slotsGiven {
			return fmt.Errorf("-ppn %d: host %s gives its own slots (%d); give the slots there or -ppn, not both", ppn, hosts[i].name, hosts[i].slots)
		}
		hosts[i].slots = ppn
	}
	return nil
}
