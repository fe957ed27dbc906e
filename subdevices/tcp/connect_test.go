package tcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/subdevices/tcp/addrsel"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    config
		wantErr string // substring of the error; empty means success
	}{
		{name: "empty", in: "", want: config{connectTimeout: defaultConnectTimeout, queueBytes: defaultQueueBytes, linkTimeout: defaultLinkTimeout}},
		{name: "empty object", in: "{}", want: config{connectTimeout: defaultConnectTimeout, queueBytes: defaultQueueBytes, linkTimeout: defaultLinkTimeout}},
		{name: "all keys", in: `{"listen": "127.0.0.1:7000", "connect_timeout": "250ms", "queue_bytes": 1024}`,
			want: config{listen: "127.0.0.1:7000", connectTimeout: 250 * time.Millisecond, queueBytes: 1024, linkTimeout: defaultLinkTimeout}},
		{name: "unknown key", in: `{"lisen": ":0"}`, wantErr: `unknown field "lisen"`},
		{name: "listen without port", in: `{"listen": "127.0.0.1"}`, wantErr: "listen \"127.0.0.1\": want host:port"},
		{name: "timeout not a duration", in: `{"connect_timeout": "10"}`, wantErr: "connect_timeout \"10\": want a duration"},
		{name: "timeout a number", in: `{"connect_timeout": 10}`, wantErr: "connect_timeout"},
		{name: "timeout negative", in: `{"connect_timeout": "-1s"}`, wantErr: "must be positive"},
		{name: "queue zero", in: `{"queue_bytes": 0}`, wantErr: "queue_bytes 0 must be in"},
		{name: "queue huge", in: `{"queue_bytes": 40000000000}`, wantErr: "queue_bytes 40000000000 must be in"},
		{name: "queue fraction", in: `{"queue_bytes": 1.5}`, wantErr: "queue_bytes"},
		{name: "include and exclude", in: `{"include": ["eth*", "10.1.0.0/16"], "exclude": ["docker0", "fd00::1/64"], "max_connections": 2}`,
			want: config{connectTimeout: defaultConnectTimeout, queueBytes: defaultQueueBytes, linkTimeout: defaultLinkTimeout, maxConns: 2, filter: ifaceFilter{
				include: []matcher{{pattern: "eth*"}, {net: netip.MustParsePrefix("10.1.0.0/16")}},
				exclude: []matcher{{pattern: "docker0"}, {net: netip.MustParsePrefix("fd00::/64")}},
			}}},
		{name: "bad CIDR", in: `{"include": ["eth0", "10.1.0.0/33"]}`, wantErr: `include[1] "10.1.0.0/33": want an interface name or a CIDR`},
		{name: "bad pattern", in: `{"exclude": ["eth["]}`, wantErr: `exclude[0] "eth[": bad interface name pattern`},
		{name: "empty name", in: `{"include": [""]}`, wantErr: `include[0] is empty`},
		{name: "include not a list", in: `{"include": "eth0"}`, wantErr: "include"},
		{name: "max connections negative", in: `{"max_connections": -1}`, wantErr: "max_connections -1 must be in [0, 64]"},
		{name: "congestion auto", in: `{"congestion_control": "auto"}`,
			want: config{connectTimeout: defaultConnectTimeout, queueBytes: defaultQueueBytes, linkTimeout: defaultLinkTimeout, congestion: "auto"}},
		{name: "congestion named", in: `{"congestion_control": "reno"}`,
			want: config{connectTimeout: defaultConnectTimeout, queueBytes: defaultQueueBytes, linkTimeout: defaultLinkTimeout, congestion: "reno"}},
		{name: "congestion empty", in: `{"congestion_control": ""}`, wantErr: `congestion_control "": want "auto", "system" or`},
		{name: "congestion not a name", in: `{"congestion_control": "Cubic!"}`, wantErr: `congestion_control "Cubic!"`},
		{name: "congestion too long", in: `{"congestion_control": "abcdefghijklmnop"}`, wantErr: `congestion_control "abcdefghijklmnop"`},
		{name: "congestion a number", in: `{"congestion_control": 1}`, wantErr: "congestion_control"},
		{name: "link timeout", in: `{"link_timeout": "5s"}`,
			want: config{connectTimeout: defaultConnectTimeout, queueBytes: defaultQueueBytes, linkTimeout: 5 * time.Second}},
		{name: "link timeout the system's", in: `{"link_timeout": "0s"}`,
			want: config{connectTimeout: defaultConnectTimeout, queueBytes: defaultQueueBytes}},
		{name: "link timeout not a duration", in: `{"link_timeout": "30"}`, wantErr: `link_timeout "30": want a duration such as "30s"`},
		{name: "link timeout negative", in: `{"link_timeout": "-1s"}`, wantErr: `link_timeout "-1s" must be 0 (the system's) or from 1ms to 24h0m0s`},
		{name: "link timeout below a millisecond", in: `{"link_timeout": "10us"}`, wantErr: `link_timeout "10us" must be 0`},
		{name: "link timeout over a day", in: `{"link_timeout": "25h"}`, wantErr: `link_timeout "25h" must be 0`},
		{name: "not an object", in: `[1]`, wantErr: "tcp: config"},
		{name: "trailing data", in: `{} {}`, wantErr: "trailing data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseConfig([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseConfig(%s) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("parseConfig(%s) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	h := newRecorder()
	tests := []struct {
		name string
		p    sdi.OpenParams
		want string
	}{
		{"nil handler", sdi.OpenParams{Size: 1}, "nil Handler"},
		{"zero size", sdi.OpenParams{Size: 0, Handler: h}, "job size 0"},
		{"rank out of range", sdi.OpenParams{Rank: 2, Size: 2, Handler: h}, "rank 2 out of range"},
		{"wrong api", sdi.OpenParams{Size: 1, Handler: h, APIVersion: "v9.0"}, "v9.0"},
		{"bad config", sdi.OpenParams{Size: 1, Handler: h, Config: []byte(`{"queue_bytes": -1}`)}, "queue_bytes -1"},
		{"unbindable listen", sdi.OpenParams{Size: 1, Handler: h, Config: []byte(`{"listen": "192.0.2.250:0"}`)}, "listen on"},
		{"unknown congestion control", sdi.OpenParams{Size: 1, Handler: h, Config: []byte(`{"congestion_control": "nosuchcc"}`)},
			`congestion_control "nosuchcc": not available in this kernel (available: `},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sd := New(nil)
			defer sd.Close(context.Background())
			if _, err := sd.Open(context.Background(), tt.p); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open() error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// closedPort returns a loopback port nobody listens on.
func closedPort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).AddrPort().Port()
	ln.Close()
	return port
}

// silentListener accepts connections and never speaks, like a stranger
// service on the port a card names.
func silentListener(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().(*net.TCPAddr).AddrPort().Port()
}

// lo is a card's loopback interface with addrs.
func lo(addrs ...netip.Prefix) []cardIface { return []cardIface{{Name: "lo", Addrs: addrs}} }

// TestConnectErrors checks that Connect reports each way a peer can be
// unreachable with ErrPeerUnreachable and a reason naming the cause, and
// that none of them disturbs a working connection.
//
// Only the silent listener must make a handshake time out. That row
// connects from quick, an instance of its own with a short connect_timeout.
// Every other handshake (the job's own, and the one refused by the peer
// with another secret) ends because of what the peer sends, so it runs
// under a connect_timeout that load cannot trip.
func TestConnectErrors(t *testing.T) {
	patient := loopbackConfig("connect_timeout", patientTimeout.String())
	nodes := newJob(t, 2, jobOpts{size: 3, config: patient})
	a, b := nodes[0], nodes[1]
	quick := openNode(t, 0, jobOpts{size: 3, config: loopbackConfig("connect_timeout", "200ms")})
	job := jobTag("job-" + t.Name())
	loop4 := netip.MustParsePrefix("127.0.0.1/8")
	loop6 := netip.MustParsePrefix("::1/128")
	mustEncode := func(c card) []byte {
		b, err := c.encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	other := openNode(t, 2, jobOpts{size: 3, secret: "another secret", config: patient})
	closed := closedPort(t)
	silent := silentListener(t)

	tests := []struct {
		name string
		peer sdi.Rank
		card []byte
		want []string // substrings of the error, which must wrap ErrPeerUnreachable
		from *node    // the instance that connects; nil means a
	}{
		{"garbage card", 1, []byte("not a card at all, certainly"), []string{"bad business card", "magic"}, nil},
		{"empty card", 1, nil, []string{"bad business card"}, nil},
		{"card of another rank", 2, b.local.Addr, []string{"belongs to rank 1"}, nil},
		{"card of another job", 1, mustEncode(card{Rank: 1, Port: 9, Ifaces: lo(loop4)}), []string{"another job"}, nil},
		{"rank outside the job", 7, b.local.Addr, []string{"out of range"}, nil},
		{"closed port", 2, mustEncode(card{Rank: 2, JobTag: job, Port: closed, Host: "testhost", Ifaces: lo(loop4, loop6)}),
			[]string{"lo 127.0.0.1 -> lo 127.0.0.1:" + itoa(closed), "refused"}, nil},
		{"silent listener times out", 2, mustEncode(card{Rank: 2, JobTag: job, Port: silent, Host: "testhost", Ifaces: lo(loop4)}),
			[]string{"127.0.0.1:" + itoa(silent), "timeout"}, quick},
		{"loopback card from another host", 2, mustEncode(card{Rank: 2, JobTag: job, Port: closed, Host: "elsewhere", Ifaces: lo(loop4)}),
			[]string{"no usable interface pair", `host "elsewhere"`, "lo - lo: 127.0.0.1/8 - 127.0.0.1/8: loopback reaches only its own host"}, nil},
		{"peer with another secret", 2, other.local.Addr, []string{"refused the handshake"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The watchdog turns a Connect that nothing else ends (a
			// connect_timeout not applied) into a failure, not a hang.
			// It cancels rather than sets a deadline: a deadline would
			// be handed on to the connection, whose read could then
			// time out just before ctx reports it is done.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			defer time.AfterFunc(watchdog, cancel).Stop()
			err := cmp.Or(tt.from, a).sd.Connect(ctx, tt.peer, tt.card)
			if ctx.Err() != nil {
				t.Fatalf("watchdog: Connect() returned only when cancelled: %v", err)
			}
			if !errors.Is(err, sdi.ErrPeerUnreachable) {
				t.Fatalf("Connect() error = %v, want ErrPeerUnreachable", err)
			}
			t.Log(err)
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Connect() error %q does not mention %q", err, w)
				}
			}
		})
	}

	t.Run("cancelled context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		c := mustEncode(card{Rank: 1, JobTag: job, Port: silent, Host: "testhost", Ifaces: lo(loop4)})
		sd := New(nil)
		defer sd.Close(context.Background())
		if _, err := sd.Open(context.Background(), sdi.OpenParams{Size: 2, Handler: newRecorder(), JobID: "job-" + "TestConnectErrors", Host: "testhost",
			Config: []byte(`{"listen": "127.0.0.1:0", "connect_timeout": "1h"}`)}); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- sd.Connect(ctx, 1, c) }()
		cancel()
		err := <-errc
		if !errors.Is(err, sdi.ErrPeerUnreachable) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Connect() error = %v, want ErrPeerUnreachable and context.Canceled", err)
		}
	})

	// None of the failures above may disturb the working connection.
	send(t, a, &sdi.Frame{Peer: b.rank, Payload: []byte("still fine")})
	b.rec.waitFor(t, "delivery", func() bool { return len(b.rec.delivered[a.rank]) == 1 })
	if !strings.Contains(other.log.String(), "authentication failed") {
		t.Errorf("the instance with another secret did not log why it refused rank 0:\n%s", other.log.String())
	}
}

// TestConnectWrongListener checks that Connect refuses a listener that does
// not prove to be the rank the card names, here a rank of the same job whose
// card was altered to name another rank.
func TestConnectWrongListener(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{size: 3})
	c, err := decodeCard(nodes[1].local.Addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Rank = 2
	forged, err := c.encode()
	if err != nil {
		t.Fatal(err)
	}
	err = nodes[0].sd.Connect(context.Background(), 2, forged)
	if !errors.Is(err, sdi.ErrPeerUnreachable) || !strings.Contains(err.Error(), "listener is rank 1, want rank 2") {
		t.Fatalf("Connect() error = %v, want ErrPeerUnreachable naming the wrong rank", err)
	}
}

func TestConnectConcurrentWithSends(t *testing.T) {
	nodes := newJob(t, 2, jobOpts{size: 3})
	a, b := nodes[0], nodes[1]
	third := openNode(t, 2, jobOpts{size: 3, config: `{"listen": "127.0.0.1:0"}`})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			send(t, a, &sdi.Frame{Peer: b.rank, Payload: pattern(100, byte(i)), Token: uint64(i)})
		}
	}()
	// Connecting again and to a new rank while frames flow to b.
	for range 3 {
		if err := a.sd.Connect(context.Background(), 2, third.local.Addr); err != nil {
			t.Fatal(err)
		}
		if err := a.sd.Connect(context.Background(), b.rank, b.local.Addr); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	b.rec.waitFor(t, "all frames", func() bool { return len(b.rec.delivered[a.rank]) == 200 })
	send(t, a, &sdi.Frame{Peer: 2, Payload: []byte("hi")})
	third.rec.waitFor(t, "frame on the new connection", func() bool { return len(third.rec.delivered[a.rank]) == 1 })
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

// FuzzParseConfig feeds arbitrary bytes to the config parser: it must not
// panic, and what it accepts must be within the documented bounds, with
// filters that can be applied.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"listen": "127.0.0.1:0", "connect_timeout": "250ms", "queue_bytes": 1024}`))
	f.Add([]byte(`{"include": ["eth*", "10.1.0.0/16"], "exclude": ["docker0", "fd00::/8"], "max_connections": 2}`))
	f.Add([]byte(`{"include": ["["]}`))
	f.Add([]byte(`{"congestion_control": "cubic"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseConfig(b)
		if err != nil {
			return
		}
		if c.connectTimeout <= 0 || c.queueBytes <= 0 || c.queueBytes > maxQueueBytes || c.maxConns < 0 || c.maxConns > maxConnections {
			t.Fatalf("accepted a config beyond the limits: %+v", c)
		}
		c.filter.keep("eth0", netip.MustParseAddr("10.1.2.3"))
		c.filter.keep("lo", netip.MustParseAddr("::1"))
		if names, strict := c.congestionFor(netip.MustParseAddr("::1")); strict && checkCongestionName(names[0]) != nil {
			t.Fatalf("accepted congestion_control %q", names[0])
		}
	})
}

func TestIfaceFilter(t *testing.T) {
	mustFilter := func(js string) ifaceFilter {
		c, err := parseConfig([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		return c.filter
	}
	tests := []struct {
		config string
		iface  string
		addr   string
		keep   bool
	}{
		{`{}`, "eth0", "10.0.0.1", true},
		{`{"include": ["eth*"]}`, "eth1", "10.0.0.1", true},
		{`{"include": ["eth*"]}`, "ib0", "10.0.0.1", false},
		{`{"include": ["eth*"]}`, "lo", "127.0.0.1", true}, // loopback needs no include
		{`{"include": ["10.1.0.0/16"]}`, "ib0", "10.1.2.3", true},
		{`{"include": ["10.1.0.0/16"]}`, "ib0", "10.2.2.3", false},
		{`{"include": ["2001:db8::/32"]}`, "eth0", "2001:db8::5", true},
		{`{"exclude": ["docker0"]}`, "docker0", "172.17.0.1", false},
		{`{"exclude": ["docker0"]}`, "eth0", "172.17.0.1", true},
		{`{"exclude": ["172.16.0.0/12"]}`, "eth0", "172.17.0.1", false},
		{`{"exclude": ["lo"]}`, "lo", "127.0.0.1", false},
		{`{"include": ["eth0"], "exclude": ["10.9.0.0/16"]}`, "eth0", "10.9.0.1", false},
		{`{"include": ["eth0"], "exclude": ["10.9.0.0/16"]}`, "eth0", "10.8.0.1", true},
	}
	for _, tt := range tests {
		if got := mustFilter(tt.config).keep(tt.iface, netip.MustParseAddr(tt.addr)); got != tt.keep {
			t.Errorf("%s: keep(%s, %s) = %v, want %v", tt.config, tt.iface, tt.addr, got, tt.keep)
		}
	}
}

// The card follows include and exclude.
func TestCardFilter(t *testing.T) {
	names := func(config string) []string {
		n := openNode(t, 0, jobOpts{size: 1, config: config})
		c, err := decodeCard(n.local.Addr)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range c.Ifaces {
			out = append(out, f.Name)
		}
		return out
	}
	if got := names(`{"include": ["no-such-interface"]}`); len(got) != 1 || got[0] != "lo" {
		t.Errorf("include of nothing: card lists %v, want lo only", got)
	}
	if got := names(`{"exclude": ["lo", "127.0.0.0/8"]}`); slices.Contains(got, "lo") {
		t.Errorf("lo excluded: card lists %v", got)
	}
}

// TestSitesChooseInClusterLAN: the site from OpenParams travels on the
// card into every rank's job, so that examples/networks/relays.hcl's two
// clusters, both on 10.0.0.0/24 with nothing else but the relays' WAN, use
// their LAN inside each cluster and never dial across it (package addrsel).
// Without sites on the cards no host of the job may use the LAN.
func TestSitesChooseInClusterLAN(t *testing.T) {
	iface := func(name, addr string) cardIface {
		return cardIface{Name: name, Addrs: []netip.Prefix{netip.MustParsePrefix(addr)}}
	}
	hosts := []struct {
		host, site string
		ifaces     []cardIface
	}{
		{"p01", "P", []cardIface{iface("eth0", "10.0.0.1/24")}},
		{"p02", "P", []cardIface{iface("eth0", "10.0.0.2/24")}},
		{"p-relay", "P", []cardIface{iface("eth0", "10.0.0.254/24"), iface("wan", "198.51.100.1/24")}},
		{"q-relay", "Q", []cardIface{iface("eth0", "10.0.0.254/24"), iface("wan", "198.51.100.2/24")}},
		{"q01", "Q", []cardIface{iface("eth0", "10.0.0.2/24")}},
	}
	ctx := context.Background()
	sds := make([]*subDevice, len(hosts))
	cards := make([][]byte, len(hosts))
	for r, h := range hosts {
		sd := New(nil).(*subDevice)
		sd.ifaces = h.ifaces
		local, err := sd.Open(ctx, sdi.OpenParams{Rank: sdi.Rank(r), Size: len(hosts), Host: h.host, Site: h.site,
			JobID: "job-" + t.Name(), Secret: []byte(testSecret), APIVersion: sdi.APIVersion,
			Config: []byte(loopbackConfig("", "")), Handler: newRecorder()})
		if err != nil {
			t.Fatalf("open %s: %v", h.host, err)
		}
		t.Cleanup(func() { sd.Close(context.Background()) })
		sds[r], cards[r] = sd, local.Addr
	}
	for r, sd := range sds {
		if err := sd.SetJobCards(ctx, cards); err != nil {
			t.Fatalf("%s: job cards: %v", hosts[r].host, err)
		}
	}
	tests := []struct {
		from, to int
		want     string // the pairs, or "" for an error mentioning the collision
	}{
		{0, 1, "[eth0 10.0.0.1 -> eth0 10.0.0.2 (weight 1)]"},
		{0, 2, "[eth0 10.0.0.1 -> eth0 10.0.0.254 (weight 1)]"},
		{4, 3, "[eth0 10.0.0.2 -> eth0 10.0.0.254 (weight 1)]"},
		{2, 3, "[wan 198.51.100.1 -> wan 198.51.100.2 (weight 2)]"},
		{0, 4, ""},
		{1, 3, ""},
	}
	for _, tt := range tests {
		from, to := hosts[tt.from].host, hosts[tt.to].host
		c, err := decodeCard(cards[tt.to])
		if err != nil {
			t.Fatalf("card of %s: %v", to, err)
		}
		if c.Site != hosts[tt.to].site {
			t.Errorf("card of %s names site %q, want %q", to, c.Site, hosts[tt.to].site)
		}
		pairs, _, err := sds[tt.from].choose(sdi.Rank(tt.to), c)
		switch {
		case tt.want == "" && (err == nil || !strings.Contains(err.Error(), "10.0.0.0/24 collides across the job")):
			t.Errorf("%s -> %s: pairs %v, error %v; want refused for the colliding LAN", from, to, pairs, err)
		case tt.want != "" && (err != nil || fmt.Sprint(pairs) != tt.want):
			t.Errorf("%s -> %s: pairs %v, error %v; want %s", from, to, pairs, err, tt.want)
		}
	}
}

// A lane whose address pair does not connect goes on to the pair's
// alternates (addrsel keeps every pair of the interfaces that would do):
// at once when the first is refused, after alternateDelay when it stalls,
// all within one connect_timeout. Connect once dialed the chosen pair
// only, so a host that firewalls the link-local pair addrsel prefers was
// unreachable although its IPv4 pair worked.
func TestDialLaneFallsBackToAlternates(t *testing.T) {
	sd, b, c, works := laneJob(t, patientTimeout.String())
	via := func(peer string) addrsel.Pair {
		p := works
		p.PeerAddr = netip.MustParseAddr(peer)
		return p
	}
	for _, tc := range []struct {
		name       string
		first      addrsel.Pair
		alts       []addrsel.Pair
		connects   bool
		failed     int           // pairs reported failed
		atLeast    time.Duration // the head start a stalled pair gets
		errMention string
	}{
		{name: "refused, then the working pair", first: via("127.0.0.2"), alts: []addrsel.Pair{works}, connects: true, failed: 1},
		{name: "stalled, then the working pair", first: via("127.0.0.3"), alts: []addrsel.Pair{works}, connects: true, atLeast: alternateDelay},
		{name: "every pair refused", first: via("127.0.0.2"), alts: []addrsel.Pair{via("127.0.0.4")}, failed: 2, errMention: "127.0.0.4"},
		{name: "working pair first", first: works, alts: []addrsel.Pair{via("127.0.0.2")}, connects: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.first
			p.Alternates = tc.alts
			start := time.Now()
			used, conn, failed := sd.dialLane(t.Context(), b.rank, p, c.Port, laneID{session: rand.Uint64(), lanes: 1})
			took := time.Since(start)
			if conn != nil {
				conn.Close()
			}
			if (conn != nil) != tc.connects || len(failed) != tc.failed {
				t.Fatalf("connected %v over %v, failed %q; want connected %v, %d failed", conn != nil, used, failed, tc.connects, tc.failed)
			}
			if tc.connects && used.PeerAddr != works.PeerAddr {
				t.Errorf("connected over %v, want %v", used, works)
			}
			if took < tc.atLeast || took > patientTimeout/2 {
				t.Errorf("took %v, want at least %v and well within connect_timeout", took, tc.atLeast)
			}
			if !strings.Contains(strings.Join(failed, "; "), tc.errMention) {
				t.Errorf("failures %q do not mention %s", failed, tc.errMention)
			}
		})
	}
}

// TestShortConnectTimeoutTriesAlternate: with connect_timeout shorter
// than alternateDelay, a stalled first pair must still leave time for the
// working alternate; it once took the lane's whole timeout.
func TestShortConnectTimeoutTriesAlternate(t *testing.T) {
	sd, b, c, works := laneJob(t, "250ms")
	first := works
	first.PeerAddr = netip.MustParseAddr("127.0.0.3")
	first.Alternates = []addrsel.Pair{works}
	used, conn, failed := sd.dialLane(t.Context(), b.rank, first, c.Port, laneID{session: rand.Uint64(), lanes: 1})
	if conn == nil {
		t.Fatalf("lane failed over %v although its alternate %v works; failures: %q", used, works, failed)
	}
	conn.Close()
}

// laneJob opens two loopback ranks with connect_timeout timeout and
// returns rank 0's subdevice, rank 1's node and card, and the one pair
// between them. 127.0.0.3 on rank 1's port holds a listener that accepts
// and never speaks, for a pair whose handshake hangs (a peer behind a
// firewall that drops the answer, a stranger's socket).
func laneJob(t *testing.T, timeout string) (*subDevice, *node, card, addrsel.Pair) {
	t.Helper()
	a := openNode(t, 0, jobOpts{size: 2, config: loopbackConfig("connect_timeout", timeout)})
	b := openNode(t, 1, jobOpts{size: 2, config: loopbackConfig("connect_timeout", timeout)})
	sd := a.sd.(*subDevice)
	c, err := decodeCard(b.local.Addr)
	if err != nil {
		t.Fatal(err)
	}
	pairs, _, err := sd.choose(b.rank, c)
	if err != nil || len(pairs) != 1 {
		t.Fatalf("pairs %v, %v; want one", pairs, err)
	}
	silent, err := net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), c.Port).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		for {
			conn, err := silent.Accept()
			if err != nil {
				return
			}
			defer conn.Close() // once the listener closes
		}
	}()
	return sd, b, c, pairs[0]
}

// TestLastOfManyAlternatesConnects: a lane of six address pairs of which
// only the last answers, and takes 400 ms to (a loaded peer), within a
// connect_timeout of 1 s it connects in alone. Each pair's head start was
// once a sixth of connect_timeout and more, so the last was dialed at 5/7
// of it and cut off mid-handshake.
func TestLastOfManyAlternatesConnects(t *testing.T) {
	sd, b, c, works := laneJob(t, "1s") // 127.0.0.3 never answers
	listen := func(ip string, serve func(net.Conn)) {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr(ip), c.Port).String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go serve(conn)
			}
		}()
	}
	listen("127.0.0.9", func(conn net.Conn) { // passes the connection on to b after 400 ms
		defer conn.Close()
		time.Sleep(400 * time.Millisecond)
		up, err := net.Dial("tcp", netip.AddrPortFrom(works.PeerAddr, c.Port).String())
		if err != nil {
			return
		}
		defer up.Close()
		go io.Copy(up, conn)
		io.Copy(conn, up)
	})
	pair := func(ip string) addrsel.Pair {
		p := works
		p.PeerAddr = netip.MustParseAddr(ip)
		return p
	}
	first := pair("127.0.0.3")
	for _, ip := range []string{"127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"} {
		listen(ip, func(conn net.Conn) { defer conn.Close(); <-t.Context().Done() }) // never answers
		first.Alternates = append(first.Alternates, pair(ip))
	}
	first.Alternates = append(first.Alternates, pair("127.0.0.9"))
	start := time.Now()
	used, conn, failed := sd.dialLane(t.Context(), b.rank, first, c.Port, laneID{session: rand.Uint64(), lanes: 1})
	if conn == nil {
		t.Fatalf("lane failed after %v, though its last alternate connects in 400 ms of the 1 s connect_timeout: %q", time.Since(start).Round(time.Millisecond), failed)
	}
	conn.Close()
	if used.PeerAddr != netip.MustParseAddr("127.0.0.9") {
		t.Errorf("connected over %v, want 127.0.0.9", used)
	}
}
