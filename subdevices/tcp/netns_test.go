package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/internal/netns"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// Tests on hosts made of network namespaces (package internal/netns). Each
// rank is this test binary re-executed inside its host, running
// TestHelperRank; ranks find each other through a bootstrap rendezvous
// server in the test process (a unix socket, which every namespace sees).

const (
	envRole   = "TCP_NETNS_ROLE"   // "exchange" or "bench"
	envConfig = "TCP_NETNS_CONFIG" // tcp config JSON for the exchange role
	envBytes  = "TCP_NETNS_BYTES"  // bytes each rank sends each peer
	envReps   = "TCP_NETNS_REPS"   // bench repetitions
)

var stripeBench = flag.Bool("tcp.stripebench", false, "run the striping benchmark on network-namespace hosts (root)")

// report is what a rank prints, as one JSON line, when it is done.
type report struct {
	Rank int      `json:"rank"`
	Host string   `json:"host"`
	Card []string `json:"card"` // interfaces on the rank's own card
	// Chosen are the pairs address selection chose ("eth0->eth1"), whether
	// or not they connected.
	Chosen   map[sdi.Rank][]string `json:"chosen"`
	Links    map[sdi.Rank][]Link   `json:"links"`
	Received map[sdi.Rank]int64    `json:"received"`
	Bench    map[string][]float64  `json:"bench,omitempty"` // config -> MB/s per repetition
	Error    string                `json:"error,omitempty"`
}

// TestHelperRank is not a test: it is one rank of a namespace scenario.
func TestHelperRank(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("helper process; runs only inside a network namespace started by another test")
	}
	rep, err := runRank(role)
	if err != nil {
		rep.Error = err.Error()
	}
	b, _ := json.Marshal(rep)
	fmt.Println(string(b))
	if err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// rankHandler counts and checks what arrives and wakes senders on SendDone.
type rankHandler struct {
	mu       sync.Mutex
	received map[sdi.Rank]int64
	bad      error
	changed  chan struct{}
}

func newRankHandler() *rankHandler {
	return &rankHandler{received: map[sdi.Rank]int64{}, changed: make(chan struct{})}
}

func (h *rankHandler) Deliver(from sdi.Rank, header, payload []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(header) == 8 && h.bad == nil {
		tok := binary.LittleEndian.Uint64(header)
		if want := pattern(len(payload), byte(tok)); !bytes.Equal(payload, want) {
			h.bad = fmt.Errorf("frame %d from rank %d corrupted", tok, from)
		}
	}
	h.received[from] += int64(len(payload))
	h.kick()
}

func (h *rankHandler) SendDone(uint64, error) {
	h.mu.Lock()
	h.kick()
	h.mu.Unlock()
}

func (h *rankHandler) PeerDown(peer sdi.Rank, err error) {
	h.mu.Lock()
	if h.bad == nil {
		h.bad = fmt.Errorf("rank %d down: %w", peer, err)
	}
	h.kick()
	h.mu.Unlock()
}

func (h *rankHandler) kick() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// wait blocks until cond holds (under the lock), a frame was bad, or ctx ends.
func (h *rankHandler) wait(ctx context.Context, cond func() bool) error {
	for {
		h.mu.Lock()
		ok, bad, ch := cond(), h.bad, h.changed
		h.mu.Unlock()
		switch {
		case bad != nil:
			return bad
		case ok:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sendAll sends f, retrying while the queue is full.
func sendAll(ctx context.Context, sd sdi.SubDevice, h *rankHandler, f *sdi.Frame) error {
	for {
		h.mu.Lock()
		ch := h.changed
		h.mu.Unlock()
		_, err := sd.Send(f)
		if !errors.Is(err, sdi.ErrWouldBlock) {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// rankJob is one opened tcp instance connected to every other rank.
type rankJob struct {
	sd   sdi.SubDevice
	h    *rankHandler
	card []string // interface names on the card
}

func openRank(ctx context.Context, bs bootstrap.Bootstrap, key, config string, log hclog.Logger) (*rankJob, error) {
	j := &rankJob{sd: New(log), h: newRankHandler()}
	local, err := j.sd.Open(ctx, sdi.OpenParams{Rank: sdi.Rank(bs.Rank()), Size: bs.Size(), Host: bs.Host(),
		JobID: bs.JobID(), Secret: bs.Secret(), Config: []byte(config), Handler: j.h, Logger: log.Named(key)})
	if err != nil {
		return nil, err
	}
	c, err := decodeCard(local.Addr)
	if err != nil {
		return j, err
	}
	for _, f := range c.Ifaces {
		j.card = append(j.card, f.Name)
	}
	if err := bs.Put(key, local.Addr); err != nil {
		return j, err
	}
	if err := bs.Fence(ctx); err != nil {
		return j, err
	}
	cards := make([][]byte, bs.Size())
	for r := range cards {
		if cards[r], err = bs.Get(ctx, r, key); err != nil {
			return j, err
		}
	}
	if !local.Caps.Flags.Has(sdi.FlagJobCards) {
		return j, errors.New("tcp does not ask for the job's cards")
	}
	if err := j.sd.(sdi.JobCards).SetJobCards(ctx, cards); err != nil {
		return j, err
	}
	for r := range cards {
		if r == bs.Rank() {
			continue
		}
		if err := j.sd.Connect(ctx, sdi.Rank(r), cards[r]); err != nil {
			return j, err
		}
	}
	return j, nil
}

func runRank(role string) (report, error) {
	rep := report{Links: map[sdi.Rank][]Link{}, Received: map[sdi.Rank]int64{}, Chosen: map[sdi.Rank][]string{}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	level := hclog.Warn
	if l := os.Getenv("MP_TEST_LOG_LEVEL"); l != "" {
		level = hclog.LevelFromString(l)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "rank", Level: level, Output: os.Stderr})
	bs, err := bootstrap.Open(ctx, log)
	if err != nil {
		return rep, err
	}
	defer bs.Close()
	rep.Rank, rep.Host = bs.Rank(), bs.Host()
	log = log.With("rank", bs.Rank())
	if role == "bench" {
		return rep, runBench(ctx, bs, &rep, log)
	}

	j, err := openRank(ctx, bs, "tcp", os.Getenv(envConfig), log)
	if j != nil {
		defer j.sd.Close(context.Background())
	}
	if err != nil {
		bs.Abort(1, err.Error())
		return rep, err
	}
	rep.Card = j.card
	// Every rank sends every other rank a few small frames and then large
	// ones, so both the first connection and striping are exercised.
	total, _ := strconv.Atoi(os.Getenv(envBytes))
	var frames []*sdi.Frame
	for i := 0; i < 8; i++ {
		frames = append(frames, &sdi.Frame{Payload: pattern(1000, byte(i))})
	}
	for sent := 8 * 1000; sent < total; sent += maxFrame {
		i := len(frames)
		frames = append(frames, &sdi.Frame{Payload: pattern(min(maxFrame, total-sent), byte(i))})
	}
	var expect int64
	for _, f := range frames {
		expect += int64(len(f.Payload))
	}
	for r := range bs.Size() {
		if r == bs.Rank() {
			continue
		}
		for i, f := range frames {
			g := *f
			g.Peer, g.Token = sdi.Rank(r), uint64(i)
			g.Header = binary.LittleEndian.AppendUint64(nil, uint64(i))
			if err := sendAll(ctx, j.sd, j.h, &g); err != nil {
				return rep, fmt.Errorf("send to rank %d: %w", r, err)
			}
		}
	}
	err = j.h.wait(ctx, func() bool {
		for r := range bs.Size() {
			if r != bs.Rank() && j.h.received[sdi.Rank(r)] < expect {
				return false
			}
		}
		return true
	})
	if err != nil {
		return rep, fmt.Errorf("receiving: %w", err)
	}
	for r := range bs.Size() {
		if r != bs.Rank() {
			if err := j.sd.Flush(ctx, sdi.Rank(r)); err != nil {
				return rep, err
			}
			rep.Links[sdi.Rank(r)] = Links(j.sd, sdi.Rank(r))
			res, _ := Chosen(j.sd, sdi.Rank(r))
			for _, p := range res.Pairs {
				rep.Chosen[sdi.Rank(r)] = append(rep.Chosen[sdi.Rank(r)], p.LocalName+"->"+p.PeerName)
			}
		}
	}
	j.h.mu.Lock()
	maps.Copy(rep.Received, j.h.received)
	j.h.mu.Unlock()
	// Nobody closes before everyone has received everything.
	return rep, bs.Fence(ctx)
}

// scenario runs one rank per host in bed and returns their reports by rank.
// hosts[r] is rank r's host.
func scenario(t *testing.T, hosts []*netns.Host, env ...string) []report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := bootstrap.NewServer(len(hosts), nil)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	defer func() {
		srv.Close()
		cancel()
		<-served
	}()

	type result struct {
		rank   int
		out    []byte
		stderr string
		err    error
	}
	results := make(chan result, len(hosts))
	for r, h := range hosts {
		cmd := h.Command(ctx, os.Args[0], "-test.run=^TestHelperRank$", "-test.timeout=3m")
		// The launcher's host would be this machine for every rank; each
		// namespace is a host of its own.
		_, short, _ := strings.Cut(h.Name(), "-")
		cmd.Env = append(append(append(os.Environ(), srv.Env(r)...), bootstrap.EnvHost+"="+short), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatalf("start rank %d in %s: %v", r, h.Name(), err)
		}
		go func() {
			err := cmd.Wait()
			if err != nil {
				cancel() // one rank failing ends the scenario
			}
			results <- result{r, stdout.Bytes(), stderr.String(), err}
		}()
	}
	reps := make([]report, len(hosts))
	var failed []string
	for range hosts {
		res := <-results
		if res.stderr != "" && (res.err != nil || testing.Verbose()) {
			t.Logf("rank %d stderr:\n%s", res.rank, res.stderr)
		}
		lines := strings.Split(strings.TrimSpace(string(res.out)), "\n")
		var rep report
		jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &rep)
		if res.err != nil || jerr != nil {
			failed = append(failed, fmt.Sprintf("rank %d: %v, report %q (%v)", res.rank, res.err, rep.Error, jerr))
			continue
		}
		reps[res.rank] = rep
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		t.Fatalf("scenario failed:\n%s", strings.Join(failed, "\n"))
	}
	// Every pair chosen must have connected: a lane that fails is left out
	// quietly, which would hide a wrong choice.
	for _, rep := range reps {
		for peer, chosen := range rep.Chosen {
			if len(chosen) != len(rep.Links[peer]) {
				t.Errorf("rank %d -> %d: chose %v but connected %s", rep.Rank, peer, chosen, linkDesc(rep.Links[peer]))
			}
		}
	}
	return reps
}

func linkDesc(ls []Link) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = fmt.Sprintf("%s->%s %v", l.LocalIface, l.PeerIface, l.PeerAddr.Addr().WithZone(""))
	}
	return strings.Join(s, ", ")
}

func counters(t *testing.T, ifs ...*netns.Iface) []uint64 {
	t.Helper()
	out := make([]uint64, len(ifs))
	for i, f := range ifs {
		_, tx, err := f.Counters()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = tx
	}
	return out
}

// Scenario 1: one cluster, two NICs per host on two subnets. Both carry
// traffic, as the interfaces' byte counters show.
func TestNetnsTwoNICs(t *testing.T) {
	bed := netns.New(t)
	s1, s2 := bed.Switch("s1"), bed.Switch("s2")
	var hosts []*netns.Host
	var nics [][]*netns.Iface
	for i := range 3 {
		h := bed.Host(fmt.Sprintf("h%d", i))
		e0 := bed.Attach(h, "eth0", s1, fmt.Sprintf("10.1.0.%d/24", i+1))
		e1 := bed.Attach(h, "eth1", s2, fmt.Sprintf("10.2.0.%d/24", i+1))
		hosts = append(hosts, h)
		nics = append(nics, []*netns.Iface{e0, e1})
	}
	before := counters(t, nics[0]...)
	const perPeer = 16 << 20
	reps := scenario(t, hosts, envRole+"=exchange", envBytes+"="+strconv.Itoa(perPeer))
	after := counters(t, nics[0]...)
	for _, rep := range reps {
		for peer, ls := range rep.Links {
			if len(ls) != 2 || ls[0].LocalIface == ls[1].LocalIface || ls[0].PeerIface == ls[1].PeerIface {
				t.Errorf("rank %d -> %d: links %s, want eth0 and eth1 each once", rep.Rank, peer, linkDesc(ls))
			}
		}
	}
	// Rank 0 sent 2 x 16 MiB; each NIC must have carried a fair part.
	for i, name := range []string{"eth0", "eth1"} {
		sent := after[i] - before[i]
		if sent < perPeer/2 {
			t.Errorf("h0 %s sent %d bytes of the %d rank 0 sent; striping did not use it", name, sent, 2*perPeer)
		}
		t.Logf("h0 %s sent %d bytes", name, sent)
	}
}

// thesisBed is the thesis's example (section 2.4.3): host A with eth0
// 193.175.13.2/24 + 2001:906:638:aa01::2/64 and eth1 2001:906:638:bb01::2/64,
// host B with eth0 193.175.14.2/24 and eth1 193.175.15.2/24 +
// 2001:906:638:bb02::2/64, each wired to a router.
func thesisBed(t *testing.T) (bed *netns.Bed, a, b *netns.Host, ifs map[string]*netns.Iface) {
	bed = netns.New(t)
	a, b, r := bed.Host("a"), bed.Host("b"), bed.Router("r")
	ifs = map[string]*netns.Iface{}
	ifs["a.eth0"], _ = bed.Wire(a, "eth0", r, "ra0", []string{"193.175.13.2/24", "2001:906:638:aa01::2/64"}, []string{"193.175.13.1/24", "2001:906:638:aa01::1/64"})
	ifs["a.eth1"], _ = bed.Wire(a, "eth1", r, "ra1", []string{"2001:906:638:bb01::2/64"}, []string{"2001:906:638:bb01::1/64"})
	ifs["b.eth0"], _ = bed.Wire(b, "eth0", r, "rb0", []string{"193.175.14.2/24"}, []string{"193.175.14.1/24"})
	ifs["b.eth1"], _ = bed.Wire(b, "eth1", r, "rb1", []string{"193.175.15.2/24", "2001:906:638:bb02::2/64"}, []string{"193.175.15.1/24", "2001:906:638:bb02::1/64"})
	a.Route("default", "193.175.13.1")
	a.Route("2001:906:638:bb02::/64", "2001:906:638:bb01::1")
	b.Route("default", "193.175.14.1")
	b.Route("2001:906:638::/48", "2001:906:638:bb02::1")
	return bed, a, b, ifs
}

// Scenario 2: the thesis's example gets two connections, to 193.175.14.2 and
// to the IPv6 address of B's eth1, and both carry traffic.
func TestNetnsThesisExample(t *testing.T) {
	_, a, b, ifs := thesisBed(t)
	before := counters(t, ifs["a.eth0"], ifs["a.eth1"])
	reps := scenario(t, []*netns.Host{a, b}, envRole+"=exchange", envBytes+"="+strconv.Itoa(8<<20))
	after := counters(t, ifs["a.eth0"], ifs["a.eth1"])
	want := map[int]string{
		0: "eth0->eth0 193.175.14.2, eth1->eth1 2001:906:638:bb02::2",
		1: "eth0->eth0 193.175.13.2, eth1->eth1 2001:906:638:bb01::2",
	}
	for _, rep := range reps {
		if got := linkDesc(rep.Links[sdi.Rank(1-rep.Rank)]); got != want[rep.Rank] {
			t.Errorf("rank %d links %s, want %s", rep.Rank, got, want[rep.Rank])
		}
	}
	for i, name := range []string{"eth0", "eth1"} {
		if sent := after[i] - before[i]; sent < 2<<20 {
			t.Errorf("A's %s sent only %d bytes", name, sent)
		}
	}
}

// Scenario 3: two clusters number their private network alike (10.0.0.1
// and 10.0.0.2 in both) and reach each other over routed IPv6. Inside a
// cluster the private network carries traffic next to IPv6; across clusters
// only IPv6 does.
func TestNetnsTwoClustersSameRange(t *testing.T) {
	bed := netns.New(t)
	r := bed.Router("r")
	var hosts []*netns.Host
	var priv []*netns.Iface
	for c := 1; c <= 2; c++ {
		pub, lan := bed.Switch(fmt.Sprintf("c%dpub", c)), bed.Switch(fmt.Sprintf("c%dlan", c))
		bed.Attach(r, fmt.Sprintf("r%d", c), pub, fmt.Sprintf("2001:db8:%d::1/64", c))
		for i := 1; i <= 2; i++ {
			h := bed.Host(fmt.Sprintf("c%dh%d", c, i))
			bed.Attach(h, "eth0", pub, fmt.Sprintf("2001:db8:%d::%d/64", c, i+1))
			priv = append(priv, bed.Attach(h, "eth1", lan, fmt.Sprintf("10.0.0.%d/24", i)))
			h.Route("2001:db8::/32", fmt.Sprintf("2001:db8:%d::1", c))
			hosts = append(hosts, h)
		}
	}
	reps := scenario(t, hosts, envRole+"=exchange", envBytes+"="+strconv.Itoa(4<<20))
	for _, rep := range reps {
		for peer, ls := range rep.Links {
			sameCluster := rep.Rank/2 == int(peer)/2
			var ifaces []string
			for _, l := range ls {
				ifaces = append(ifaces, l.PeerIface)
				if l.PeerIface == "eth0" && !strings.HasPrefix(l.PeerAddr.Addr().String(), "2001:db8:") {
					t.Errorf("rank %d -> %d: eth0 link to %v, want the global IPv6 address", rep.Rank, peer, l.PeerAddr)
				}
			}
			want := "[eth0]"
			if sameCluster {
				want = "[eth0 eth1]"
			}
			if fmt.Sprint(ifaces) != want {
				t.Errorf("rank %d -> %d (same cluster %v): links %s, want to %s", rep.Rank, peer, sameCluster, linkDesc(ls), want)
			}
		}
	}
	// Private networks carried the in-cluster share only: something, but
	// not the cross-cluster traffic (which would at least double it).
	for i, f := range priv {
		_, tx, err := f.Counters()
		if err != nil {
			t.Fatal(err)
		}
		if tx == 0 {
			t.Errorf("host %d's private eth1 carried nothing", i)
		}
	}
}

// Scenario 4: private networks joined by a router. No pair qualifies, so
// the private addresses are tried as the thesis's fallback, and work.
func TestNetnsRoutedPrivate(t *testing.T) {
	bed := netns.New(t)
	a, b, r := bed.Host("a"), bed.Host("b"), bed.Router("r")
	bed.Wire(a, "eth0", r, "ra", []string{"10.1.0.2/24"}, []string{"10.1.0.1/24"})
	bed.Wire(b, "eth0", r, "rb", []string{"192.168.7.2/24"}, []string{"192.168.7.1/24"})
	a.Route("default", "10.1.0.1")
	b.Route("default", "192.168.7.1")
	reps := scenario(t, []*netns.Host{a, b}, envRole+"=exchange", envBytes+"="+strconv.Itoa(1<<20))
	if got := linkDesc(reps[0].Links[1]); got != "eth0->eth0 192.168.7.2" {
		t.Errorf("links %s, want eth0->eth0 192.168.7.2", got)
	}
	if reps[0].Links[1][0].Weight != 0 {
		t.Errorf("weight %d, want 0 for a fallback pair", reps[0].Links[1][0].Weight)
	}
}

// Two clusters number their LAN 10.0.0.0/24 alike (10.0.0.1 on a1 and
// on b1) and reach each other only between their management networks
// 192.168.1/24 and 192.168.2/24, through a router. No pair qualifies
// across the clusters, so the fallback tries private addresses: the
// routed management ones, never the colliding LAN, whose 10.0.0.3 is, from
// a2, an address of its own segment. a2 and b1 once never connected.
func TestNetnsFallbackBesideCollidingLAN(t *testing.T) {
	bed := netns.New(t)
	r := bed.Router("r")
	var hosts []*netns.Host
	for c, names := range [][]string{{"a1", "a2"}, {"b1", "b3"}} {
		lan, mgmt := bed.Switch(fmt.Sprintf("lan%d", c)), bed.Switch(fmt.Sprintf("mgmt%d", c))
		bed.Attach(r, fmt.Sprintf("r%d", c), mgmt, fmt.Sprintf("192.168.%d.254/24", c+1))
		for _, n := range names {
			h := bed.Host(n)
			bed.Attach(h, "eth0", lan, "10.0.0."+n[1:]+"/24")
			bed.Attach(h, "eth1", mgmt, fmt.Sprintf("192.168.%d.%s/24", c+1, n[1:]))
			h.Route(fmt.Sprintf("192.168.%d.0/24", 2-c), fmt.Sprintf("192.168.%d.254", c+1))
			hosts = append(hosts, h)
		}
	}
	reps := scenario(t, hosts, envRole+"=exchange", envBytes+"=100000", envConfig+`={"connect_timeout": "3s"}`)
	for _, rep := range reps {
		for peer, ls := range rep.Links {
			for _, l := range ls {
				if rep.Rank/2 != int(peer)/2 && l.PeerIface != "eth1" {
					t.Errorf("rank %d -> %d, across the clusters: links %s, want the management network's eth1", rep.Rank, peer, linkDesc(ls))
				}
			}
		}
	}
}

// Two machines that the launcher names alike (os.Hostname in two network
// namespaces or containers; PMI without a process mapping): their cards
// share no address but loopback, so they are two hosts to address
// selection, which once dialed 127.0.0.1 between them.
func TestNetnsOneNameTwoMachines(t *testing.T) {
	bed := netns.New(t)
	a, b := bed.Host("a"), bed.Host("b")
	sw := bed.Switch("lan")
	bed.Attach(a, "eth0", sw, "10.0.0.1/24")
	bed.Attach(b, "eth0", sw, "10.0.0.2/24")
	reps := scenario(t, []*netns.Host{a, b}, envRole+"=exchange", envBytes+"=100000", "MDRUN_HOST=node")
	for _, rep := range reps {
		for peer, ls := range rep.Links {
			if len(ls) != 1 || ls[0].LocalIface != "eth0" || ls[0].PeerIface != "eth0" {
				t.Errorf("rank %d -> %d: links %s, want one over eth0", rep.Rank, peer, linkDesc(ls))
			}
		}
	}
}

// Scenario 5: a docker0-like interface with the same address on every host
// is never selected; the real network is.
func TestNetnsDockerBridge(t *testing.T) {
	bed := netns.New(t)
	sw := bed.Switch("lan")
	var hosts []*netns.Host
	for i := range 3 {
		h := bed.Host(fmt.Sprintf("h%d", i))
		bed.Attach(h, "eth0", sw, fmt.Sprintf("10.5.0.%d/24", i+1))
		// A bridge with one container-like veth port, so it has carrier,
		// like docker0 once containers run.
		for _, args := range [][]string{
			{"ip", "link", "add", "docker0", "type", "bridge"},
			{"ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"},
			{"ip", "link", "set", "veth0", "master", "docker0", "up"},
			{"ip", "link", "set", "veth1", "up"},
			{"ip", "addr", "add", "172.17.0.1/16", "dev", "docker0"},
			{"ip", "link", "set", "docker0", "up"},
		} {
			if out, err := h.Run(args...); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		}
		hosts = append(hosts, h)
	}
	// The bed waits for its own interfaces; docker0 is ours to wait for,
	// or the ranks might leave it out as not running, and prove nothing.
	for _, h := range hosts {
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err := h.Run("ip", "-o", "link", "show", "docker0")
			if err == nil && strings.Contains(out, "state UP") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("docker0 in %s not up: %v\n%s", h.Name(), err, out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	reps := scenario(t, hosts, envRole+"=exchange", envBytes+"="+strconv.Itoa(1<<20))
	for _, rep := range reps {
		if !slices.Contains(rep.Card, "docker0") {
			t.Fatalf("rank %d's card lists %v, without docker0: the test proves nothing", rep.Rank, rep.Card)
		}
		for peer, ls := range rep.Links {
			if len(ls) != 1 || ls[0].PeerIface != "eth0" || ls[0].LocalIface != "eth0" {
				t.Errorf("rank %d -> %d: links %s, want eth0 only", rep.Rank, peer, linkDesc(ls))
			}
		}
	}
}

// runBench is rank 0 sending 64 MiB to rank 1, over one NIC pair and over
// two, alternating, and reporting the rate of each run.
func runBench(ctx context.Context, bs bootstrap.Bootstrap, rep *report, log hclog.Logger) error {
	configs := []struct{ name, config string }{
		{"one", `{"include": ["eth0"]}`},
		{"two", `{"include": ["eth0", "eth1"]}`},
	}
	jobs := map[string]*rankJob{}
	for _, c := range configs {
		j, err := openRank(ctx, bs, "tcp-"+c.name, c.config, log)
		if j != nil {
			defer j.sd.Close(context.Background())
		}
		if err != nil {
			return err
		}
		jobs[c.name] = j
		rep.Links[sdi.Rank(1-bs.Rank())] = append(rep.Links[sdi.Rank(1-bs.Rank())], Links(j.sd, sdi.Rank(1-bs.Rank()))...)
	}
	reps, _ := strconv.Atoi(os.Getenv(envReps))
	const total = 64 << 20
	payload := make([]byte, maxFrame)
	rep.Bench = map[string][]float64{}
	for i := range reps {
		order := configs
		if i%2 == 1 {
			order = []struct{ name, config string }{configs[1], configs[0]}
		}
		for _, c := range order {
			j := jobs[c.name]
			if err := bs.Fence(ctx); err != nil {
				return err
			}
			if bs.Rank() == 1 {
				// Receive everything, then answer with one small frame.
				if err := j.h.wait(ctx, func() bool { return j.h.received[0] >= int64(total*(i+1)) }); err != nil {
					return err
				}
				if err := sendAll(ctx, j.sd, j.h, &sdi.Frame{Peer: 0, Payload: []byte{1}}); err != nil {
					return err
				}
				continue
			}
			start := time.Now()
			for sent := 0; sent < total; sent += maxFrame {
				if err := sendAll(ctx, j.sd, j.h, &sdi.Frame{Peer: 1, Payload: payload}); err != nil {
					return err
				}
			}
			if err := j.h.wait(ctx, func() bool { return j.h.received[1] >= int64(i+1) }); err != nil {
				return err
			}
			secs := time.Since(start).Seconds()
			rep.Bench[c.name] = append(rep.Bench[c.name], total/secs/1e6)
			log.Info("bench run", "config", c.name, "rep", i, "MB/s", total/secs/1e6)
		}
	}
	return bs.Fence(ctx)
}

// TestStripeBench measures the bar of issue 4: two NIC pairs, each limited
// by tbf to the same rate, against one pair, in one run with the two
// configurations interleaved. It prints the rates and the ratio of their
// medians; it asserts nothing about time. Run it as root with
//
//	go test ./subdevices/tcp -run '^TestStripeBench$' -v -tcp.stripebench
func TestStripeBench(t *testing.T) {
	if !*stripeBench {
		t.Skip("benchmark; run with -tcp.stripebench (as root)")
	}
	const rate = "500mbit"
	reps := 10
	bed := netns.New(t)
	a, b := bed.Host("a"), bed.Host("b")
	for i := range 2 {
		ia, ib := bed.Wire(a, fmt.Sprintf("eth%d", i), b, fmt.Sprintf("eth%d", i),
			[]string{fmt.Sprintf("10.%d.0.1/24", i+1)}, []string{fmt.Sprintf("10.%d.0.2/24", i+1)})
		for _, f := range []*netns.Iface{ia, ib} {
			if err := f.Limit(rate); err != nil {
				t.Fatal(err)
			}
		}
	}
	res := scenario(t, []*netns.Host{a, b}, envRole+"=bench", envReps+"="+strconv.Itoa(reps))
	r0 := res[0]
	t.Logf("links: %s", linkDesc(r0.Links[1]))
	med := map[string]float64{}
	for _, name := range []string{"one", "two"} {
		v := slices.Clone(r0.Bench[name])
		slices.Sort(v)
		med[name] = v[len(v)/2]
		t.Logf("%s NIC pair(s), tbf %s each, 64 MiB: MB/s per run %.1f; median %.1f", name, rate, r0.Bench[name], med[name])
	}
	fmt.Printf("stripe bench: one pair %.1f MB/s, two pairs %.1f MB/s (medians of %d interleaved runs, tbf %s per NIC): ratio %.2f\n",
		med["one"], med["two"], reps, rate, med["two"]/med["one"])
}

// Two hosts on one IPv4 LAN, one of which firewalls IPv6 as a host whose
// admin opens the cluster subnet in iptables and leaves ip6tables at DROP
// does. Their cards also list the fe80:: address Linux gives every
// interface, and the link-local pair wins the tie at weight 1 against the
// IPv4 one, which works. Connect dialed the chosen pair only and failed
// with ErrPeerUnreachable; it must fall back to the IPv4 pair, at once
// where IPv6 is refused and after a head start where it is dropped.
func TestNetnsLinkLocalBlockedFallsBack(t *testing.T) {
	for _, action := range []string{"prohibit", "blackhole"} {
		t.Run(action, func(t *testing.T) {
			bed := netns.New(t)
			s1 := bed.Switch("s1")
			h0, h1 := bed.Host("h0"), bed.Host("h1")
			bed.Attach(h0, "eth0", s1, "10.1.0.1/24")
			bed.Attach(h1, "eth0", s1, "10.1.0.2/24")
			// Inbound IPv6 TCP on h1's eth0 meets the rule before the
			// local table (prohibit answers with an ICMP error,
			// blackhole says nothing), so neither direction connects
			// over IPv6: h0's SYN is stopped on arrival, h1's
			// SYN-ACKs back from h0 are.
			for _, args := range [][]string{
				{"ip", "-6", "rule", "add", "pref", "100", "lookup", "local"},
				{"ip", "-6", "rule", "del", "pref", "0"},
				{"ip", "-6", "rule", "add", "pref", "50", "iif", "eth0", "ipproto", "tcp", action},
			} {
				if out, err := h1.Run(args...); err != nil {
					t.Fatalf("%v: %v %s", args, err, out)
				}
			}
			reps := scenario(t, []*netns.Host{h0, h1}, envRole+"=exchange", envBytes+"="+strconv.Itoa(1<<16),
				envConfig+`={"connect_timeout": "3s"}`)
			for _, rep := range reps {
				for peer, ls := range rep.Links {
					if len(ls) != 1 || !ls[0].PeerAddr.Addr().Is4() {
						t.Errorf("rank %d -> %d: links %s, want the IPv4 pair", rep.Rank, peer, linkDesc(ls))
					}
				}
			}
		})
	}
}
