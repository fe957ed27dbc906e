package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseArgsHosts: -hosts is at least 1 and at most the ranks of every
// test asked for; with more than one host the subdevices default to shm
// and tcp, and shm alone and -baseline are refused.
func TestParseArgsHosts(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		hosts int
		sub   string
		err   string
	}{
		{nil, 1, "shm", ""},
		{[]string{"-hosts", "1", "-n", "3", "allreduce"}, 1, "shm", ""},
		{[]string{"-hosts", "0", "allreduce"}, 0, "", "-hosts 0: want at least 1"},
		{[]string{"-hosts", "-2", "lat"}, 0, "", "-hosts -2: want at least 1"},
		{[]string{"-hosts", "two", "lat"}, 0, "", `invalid value "two" for flag -hosts`},
		{[]string{"-hosts", "2", "-n", "4", "allreduce", "barrier"}, 2, "", ""},
		{[]string{"-hosts", "4", "-n", "4", "bcast"}, 4, "", ""},
		{[]string{"-hosts", "5", "-n", "4", "alltoall"}, 0, "", "-hosts 5: alltoall runs on 4 ranks (-n), too few for 5 hosts"},
		{[]string{"-hosts", "2", "lat"}, 2, "", ""},
		{[]string{"-hosts", "2"}, 2, "", ""}, // lat bw bibw, across two hosts
		{[]string{"-hosts", "2", "idle"}, 2, "", ""},
		{[]string{"-hosts", "3", "-n", "6", "allreduce", "lat"}, 0, "", "-hosts 3: lat runs on 2 ranks (its two ranks), too few for 3 hosts"},
		{[]string{"-hosts", "3", "idle"}, 0, "", "-hosts 3: idle runs on 2 ranks"},
		{[]string{"-hosts", "3", "-pairs", "1", "mr"}, 0, "", "-hosts 3: mr runs on 2 ranks (twice -pairs)"},
		{[]string{"-hosts", "4", "-pairs", "2", "mr"}, 4, "", ""},
		{[]string{"-hosts", "2", "-sub", "tcp", "lat"}, 2, "tcp", ""},
		{[]string{"-hosts", "2", "-sub", "tcp", "-direct", "lat"}, 2, "tcp", ""},
		{[]string{"-hosts", "2", "-direct", "lat"}, 0, "", "-direct needs -sub"},
		{[]string{"-hosts", "2", "-sub", "shm", "lat"}, 0, "", "-hosts 2 with -sub shm: shm reaches only ranks on its own host"},
		{[]string{"-hosts", "2", "-baseline", "-n", "4", "allreduce"}, 0, "", "-hosts 2 with -baseline: the MPIs cannot pretend hosts"},
		{[]string{"-hosts", "2", "-plugins", "p.hcl", "lat"}, 2, "", ""},
	} {
		o, ok := parseCase(t, tc.args, tc.err)
		if !ok {
			continue
		}
		if o.hosts != tc.hosts || o.sub != tc.sub {
			t.Errorf("parseArgs(%q): hosts %d, sub %q; want %d, %q", tc.args, o.hosts, o.sub, tc.hosts, tc.sub)
		}
	}
}

// TestPlacement: ranks go to hosts in contiguous blocks, as mpiexec
// places them, and the reports say where they ran.
func TestPlacement(t *testing.T) {
	for _, tc := range []struct {
		p     placement
		hosts []int
		str   string
	}{
		{placement{2, 1}, []int{0, 0}, "2 ranks on 1 host"},
		{placement{2, 2}, []int{0, 1}, "2 ranks on 2 pretend hosts"},
		{placement{4, 2}, []int{0, 0, 1, 1}, "4 ranks on 2 pretend hosts"},
		{placement{5, 2}, []int{0, 0, 0, 1, 1}, "5 ranks on 2 pretend hosts"},
		{placement{7, 3}, []int{0, 0, 0, 1, 1, 2, 2}, "7 ranks on 3 pretend hosts"},
		{placement{4, 4}, []int{0, 1, 2, 3}, "4 ranks on 4 pretend hosts"},
	} {
		var got []int
		for r := range tc.p.ranks {
			got = append(got, tc.p.host(r))
			if name, want := tc.p.hostName(r), hostPrefix+string(rune('0'+tc.hosts[r])); name != want {
				t.Errorf("%+v: rank %d on %q, want %q", tc.p, r, name, want)
			}
		}
		if !slices.Equal(got, tc.hosts) {
			t.Errorf("%+v: hosts %v, want %v", tc.p, got, tc.hosts)
		}
		if s := tc.p.String(); s != tc.str {
			t.Errorf("%+v: %q, want %q", tc.p, s, tc.str)
		}
	}
}

// TestFlows: the ranks' links are summed by subdevice, within hosts and
// between them, without a rank's traffic to itself; a rank that ran
// under another host name than it was given fails the launch.
func TestFlows(t *testing.T) {
	p := placement{ranks: 4, hosts: 2}
	reports := []rankLinks{
		{Rank: 0, Host: "mdbench-h0", Links: []link{{0, "self", 9, 90}, {1, "shm", 2, 20}, {2, "tcp", 3, 30}, {3, "tcp", 1, 10}}},
		{Rank: 3, Host: "mdbench-h1", Links: []link{{2, "shm", 5, 50}, {0, "tcp", 4, 40}}},
	}
	got, err := p.flows(reports)
	if err != nil {
		t.Fatal(err)
	}
	want := []flow{{"shm", false, 7, 70}, {"tcp", true, 8, 80}}
	if !slices.Equal(got, want) {
		t.Errorf("flows %+v, want %+v", got, want)
	}
	for _, bad := range []struct {
		rl  rankLinks
		err string
	}{
		{rankLinks{Rank: 2, Host: "mdbench-h0"}, `rank 2 ran on host "mdbench-h0", want pretend host "mdbench-h1"`},
		{rankLinks{Rank: 4, Host: "mdbench-h1"}, "rank 4 of 4"},
		{rankLinks{Rank: 1, Host: "mdbench-h0", Links: []link{{7, "tcp", 1, 1}}}, "traffic to rank 7 of 4"},
	} {
		if _, err := p.flows([]rankLinks{bad.rl}); err == nil || !strings.Contains(err.Error(), bad.err) {
			t.Errorf("flows(%+v) error %v, want one containing %q", bad.rl, err, bad.err)
		}
	}
}

// TestRunHosts runs collectives on 4 ranks on 2 pretend hosts, briefly,
// and checks that they ran, that the reports say where, and that shm
// carried the traffic within the pretend hosts and tcp, alone, the
// traffic between them (the ranks' World.Stats, classified by the hosts
// their ranks were given, which they also report back).
func TestRunHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("launches ranks")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := runJSON(ctx, t, []string{"-hosts", "2", "-n", "4", "-reps", "1", "-scale", "0.01", "-sizes", "8,4K", "-format", "json", "allreduce", "barrier"})
	checkCollectives(t, r, []string{"allreduce", "barrier"}, []int{8, 4 << 10}, []string{ours}, 1)
	if r.Hosts != 2 || r.Ranks["allreduce"] != 4 || r.Ranks["barrier"] != 4 {
		t.Errorf("report says hosts %d, ranks %v; want 2 hosts, 4 ranks each", r.Hosts, r.Ranks)
	}
	if len(r.Traffic) != 1 {
		t.Fatalf("traffic %+v, want one entry: ours, allreduce and barrier in one launch", r.Traffic)
	}
	tr := r.Traffic[0]
	if tr.Series != ours || !slices.Equal(tr.Tests, []string{"allreduce", "barrier"}) || tr.Ranks != 4 || tr.Launches != 1 {
		t.Errorf("traffic %+v: want ours, allreduce barrier, 4 ranks, 1 launch", tr)
	}
	var within, between []string
	for _, f := range tr.Flows {
		if f.Bytes == 0 || f.Frames == 0 {
			t.Errorf("flow %+v carried nothing", f)
		}
		if f.Between {
			between = append(between, f.SubDevice)
		} else {
			within = append(within, f.SubDevice)
		}
	}
	if !slices.Equal(within, []string{"shm"}) || !slices.Equal(between, []string{"tcp"}) {
		t.Errorf("within hosts %v, between hosts %v; want shm alone within, tcp alone between (%+v)", within, between, tr.Flows)
	}

	rows := checkOutputs(t, &r, "2 pretend hosts mdbench-h0..1", "(us, lower is better; 4 ranks on 2 pretend hosts)", "traffic: multidevice, allreduce barrier on 4 ranks on 2 pretend hosts, a launch: within hosts shm ", "; between hosts tcp ")
	if h := rows[0]; h[len(h)-2] != "ranks" || h[len(h)-1] != "hosts" {
		t.Fatalf("CSV header %q: want ranks and hosts last", h)
	}
	for _, row := range rows[1:] {
		if row[len(row)-2] != "4" || row[len(row)-1] != "2" {
			t.Errorf("CSV row %q: want 4 ranks on 2 hosts", row)
		}
	}
}
