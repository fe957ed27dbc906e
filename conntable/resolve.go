package conntable

import (
	"fmt"
	"strconv"
	"strings"
)

// Hop is a route compiled for one job: the subdevice to hand the frame to and
// the rank it goes to first (the peer itself for a direct route).
type Hop struct {
	SubDevice string
	Via       int32 // next-hop rank; -1 for a direct link
	Standby   bool  // Route.Standby
}

// Resolved is a table compiled for one rank of one job. It is immutable and
// safe for concurrent use.
type Resolved struct {
	classes  []Class
	routes   [][][]Hop // [peer][class] -> ordered hops; nil for self
	failover []bool    // [peer] its entry asks for failover
}

// Resolve compiles the table for rank self of a job whose rank r runs on host
// hosts[r]. Every other rank must be covered by some entry.
func (t *Table) Resolve(self int, hosts []string) (*Resolved, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if self < 0 || self >= len(hosts) {
		return nil, fmt.Errorf("conntable: rank %d outside a job of %d", self, len(hosts))
	}
	myHost := hosts[self]
	if t.Host != "" && t.Host != myHost {
		return nil, fmt.Errorf("%w: table is for host %q but rank %d runs on %q", ErrInvalid, t.Host, self, myHost)
	}
	firstRank := make(map[string]int32, len(hosts))
	for r := len(hosts) - 1; r >= 0; r-- {
		firstRank[hosts[r]] = int32(r)
	}
	bySel := make(map[string]*Entry, len(t.Peers))
	for i := range t.Peers {
		bySel[t.Peers[i].To] = &t.Peers[i]
	}
	classes := t.classes()
	res := &Resolved{classes: classes, routes: make([][][]Hop, len(hosts)), failover: make([]bool, len(hosts))}
	for peer := range hosts {
		if peer == self {
			continue
		}
		e := pick(bySel, peer, hosts[peer], hosts[peer] == myHost)
		if e == nil {
			return nil, fmt.Errorf("%w: no entry covers rank %d on host %q (add one for %q, %q or %q)",
				ErrInvalid, peer, hosts[peer], hosts[peer], locality(hosts[peer] == myHost), SelectAll)
		}
		perClass := make([][]Hop, len(classes))
		for ci, c := range classes {
			routes, ok := e.Routes[c.Name]
			if !ok {
				routes = e.Routes[AllClasses]
			}
			hops := make([]Hop, 0, len(routes))
			for _, r := range routes {
				via := int32(-1)
				if r.Via != "" {
					v, err := hopRank(r.Via, firstRank, len(hosts))
					if err != nil {
						return nil, fmt.Errorf("%w: entry %q, class %q: %v", ErrInvalid, e.To, c.Name, err)
					}
					if v != int32(peer) && v != int32(self) {
						via = v
					}
				}
				hops = append(hops, Hop{SubDevice: r.SubDevice, Via: via, Standby: r.Standby})
			}
			perClass[ci] = hops
		}
		res.routes[peer] = perClass
		res.failover[peer] = e.Failover
	}
	return res, nil
}

func locality(local bool) string {
	if local {
		return SelectLocal
	}
	return SelectRemote
}

func pick(bySel map[string]*Entry, peer int, host string, local bool) *Entry {
	if e := bySel[rankPrefix+strconv.Itoa(peer)]; e != nil {
		return e
	}
	if e := bySel[host]; e != nil {
		return e
	}
	if e := bySel[locality(local)]; e != nil {
		return e
	}
	return bySel[SelectAll]
}

func hopRank(via string, firstRank map[string]int32, size int) (int32, error) {
	if n, ok := strings.CutPrefix(via, rankPrefix); ok {
		r, err := strconv.Atoi(n)
		if err != nil || r < 0 || r >= size {
			return 0, fmt.Errorf("via %q: no such rank in a job of %d", via, size)
		}
		return int32(r), nil
	}
	r, ok := firstRank[via]
	if !ok {
		return 0, fmt.Errorf("via host %q runs no rank of this job", via)
	}
	return r, nil
}

// Classes returns the size classes, ascending.
func (r *Resolved) Classes() []Class { return r.classes }

// Class returns the index of the size class a message of n bytes falls in.
func (r *Resolved) Class(n int) int {
	last := len(r.classes) - 1
	for i := 0; i < last; i++ {
		if int64(n) <= r.classes[i].MaxBytes {
			return i
		}
	}
	return last
}

// Lookup returns the ordered hops to peer for a message of n bytes; nil for
// this rank itself or a peer outside the job.
func (r *Resolved) Lookup(peer, n int) []Hop {
	if peer < 0 || peer >= len(r.routes) || r.routes[peer] == nil {
		return nil
	}
	return r.routes[peer][r.Class(n)]
}

// Failover reports whether the entry covering peer asks for failover
// (Entry.Failover).
func (r *Resolved) Failover(peer int) bool {
	return peer >= 0 && peer < len(r.failover) && r.failover[peer]
}

// ByClass returns the ordered hops to peer for every class, indexed like
// Classes; nil for this rank itself or a peer outside the job.
func (r *Resolved) ByClass(peer int) [][]Hop {
	if peer < 0 || peer >= len(r.routes) {
		return nil
	}
	return r.routes[peer]
}
