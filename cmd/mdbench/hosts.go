package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// hostPrefix starts the names of the pretend hosts of -hosts: mdbench-h0,
// mdbench-h1, ...
const hostPrefix = "mdbench-h"

// linksPrefix starts the line in which a rank reports, before it
// finalizes, what its subdevices carried (see rankLinks).
const linksPrefix = "MDBENCH-LINKS "

// placement puts the ranks of one launch on pretend hosts of this
// machine in blocks, as mpiexec places them by default: rank r of n on
// host r*hosts/n, so a host's ranks are contiguous and the hosts hold
// n/hosts ranks each, the first ones one more when that does not divide
// (5 ranks on 2 hosts: 0-2 on the first, 3-4 on the second).
// Ranks on one pretend host share memory; ranks on different ones see
// each other only through the network (the shm subdevice reaches only
// ranks whose host name is its own; tcp uses loopback only between ranks
// of one host name, and otherwise an address of an interface that is up).
// One host (hosts <= 1) is the real one, under the host name the
// rendezvous service gives.
type placement struct {
	ranks, hosts int
}

// pretend reports whether p names hosts of its own.
func (p placement) pretend() bool { return p.hosts > 1 }

// host returns the pretend host of rank r.
func (p placement) host(r int) int { return r * p.hosts / p.ranks }

// hostName returns the name of the pretend host of rank r.
func (p placement) hostName(r int) string { return fmt.Sprintf("%s%d", hostPrefix, p.host(r)) }

// String says where the ranks run, for the reports: "4 ranks on 2
// pretend hosts", "2 ranks on 1 host".
func (p placement) String() string {
	if p.pretend() {
		return fmt.Sprintf("%d ranks on %d pretend hosts", p.ranks, p.hosts)
	}
	return fmt.Sprintf("%d ranks on 1 host", p.ranks)
}

// rankLinks is a rank's report of what its subdevices carried to every
// other rank (adi's World.Stats) over a whole launch, with the host name
// it ran under (World.Host).
type rankLinks struct {
	Rank  int    `json:"rank"`
	Host  string `json:"host"`
	Links []link `json:"links"`
}

// link is one (peer, subdevice) entry of a rankLinks.
type link struct {
	Peer      int    `json:"peer"`
	SubDevice string `json:"subdevice"`
	Frames    uint64 `json:"frames"`
	Bytes     uint64 `json:"bytes"`
}

// flow is what one subdevice carried between the ranks of one launch,
// summed over the ranks: within pretend hosts or between them.
type flow struct {
	SubDevice string `json:"subdevice"`
	Between   bool   `json:"between_hosts"`
	Frames    uint64 `json:"frames"`
	Bytes     uint64 `json:"bytes"`
}

// flows classifies the links the ranks of a launch on p reported by the
// hosts p put their ends on. It refuses a report from a rank that ran
// under another host name than p gave it: its traffic would be counted
// on the wrong side, and the launch did not measure what it says. A
// rank's traffic to itself is left out.
func (p placement) flows(reports []rankLinks) ([]flow, error) {
	idx := map[flow]int{}
	var out []flow
	for _, rl := range reports {
		if rl.Rank < 0 || rl.Rank >= p.ranks {
			return nil, fmt.Errorf("a rank reports itself as rank %d of %d", rl.Rank, p.ranks)
		}
		if want := p.hostName(rl.Rank); rl.Host != want {
			return nil, fmt.Errorf("rank %d ran on host %q, want pretend host %q", rl.Rank, rl.Host, want)
		}
		for _, l := range rl.Links {
			if l.Peer == rl.Rank {
				continue
			}
			if l.Peer < 0 || l.Peer >= p.ranks {
				return nil, fmt.Errorf("rank %d reports traffic to rank %d of %d", rl.Rank, l.Peer, p.ranks)
			}
			k := flow{SubDevice: l.SubDevice, Between: p.host(l.Peer) != p.host(rl.Rank)}
			i, ok := idx[k]
			if !ok {
				i = len(out)
				idx[k] = i
				out = append(out, k)
			}
			out[i].Frames += l.Frames
			out[i].Bytes += l.Bytes
		}
	}
	slices.SortFunc(out, func(a, b flow) int {
		if a.Between != b.Between {
			if a.Between {
				return 1
			}
			return -1
		}
		return strings.Compare(a.SubDevice, b.SubDevice)
	})
	return out, nil
}

// parseLinks reads the rest of a links line.
func parseLinks(rest string) (rankLinks, error) {
	var rl rankLinks
	if err := json.Unmarshal([]byte(rest), &rl); err != nil {
		return rankLinks{}, err
	}
	return rl, nil
}
