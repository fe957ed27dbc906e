package conntable

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const mixed = `{
  "version": 1,
  "classes": [{"name": "small", "max_bytes": 1024}, {"name": "large"}],
  "peers": [
    {"to": "@local",  "routes": {"small": [{"subdevice": "shm"}], "large": [{"subdevice": "tcp"}]}},
    {"to": "@remote", "routes": {"*": [{"subdevice": "tcp"}]}},
    {"to": "rank:2",  "routes": {"*": [{"subdevice": "verbs"}, {"subdevice": "tcp", "standby": true}]}, "failover": true},
    {"to": "b1",      "routes": {"*": [{"subdevice": "tcp", "via": "a2"}]}}
  ]
}`

func TestResolve(t *testing.T) {
	tab, err := Parse([]byte(mixed))
	if err != nil {
		t.Fatal(err)
	}
	hosts := []string{"a1", "a1", "a2", "a2", "b1"}
	res, err := tab.Resolve(0, hosts)
	if err != nil {
		t.Fatal(err)
	}
	for peer, want := range []bool{false, false, true, false, false, false} {
		if res.Failover(peer) != want {
			t.Errorf("Failover(%d) = %v", peer, !want)
		}
	}
	for _, tc := range []struct {
		peer, size int
		want       []Hop
	}{
		{1, 10, []Hop{{"shm", -1, false}}},
		{1, 1024, []Hop{{"shm", -1, false}}},
		{1, 1025, []Hop{{"tcp", -1, false}}},
		{2, 5, []Hop{{"verbs", -1, false}, {"tcp", -1, true}}},
		{3, 5, []Hop{{"tcp", -1, false}}},
		{4, 1 << 20, []Hop{{"tcp", 2, false}}},
		{0, 5, nil},
		{9, 5, nil},
	} {
		if got := res.Lookup(tc.peer, tc.size); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Lookup(%d, %d) = %v, want %v", tc.peer, tc.size, got, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"syntax", "{\n  \"version\": 1,\n  \"peers\": [}", "line 3, column 13"},
		{"unknown field", `{"version":1,"peers":[],"colour":1}`, `unknown field "colour"`},
		{"version", `{"version":2,"peers":[]}`, "version is 2"},
		{"class order", `{"version":1,"classes":[{"name":"a","max_bytes":9},{"name":"b","max_bytes":5},{"name":"c"}],"peers":[]}`, "classes[1] (b): max_bytes 5 must be greater"},
		{"last bounded", `{"version":1,"classes":[{"name":"a","max_bytes":9}],"peers":[]}`, "must be unbounded"},
		{"unknown class", `{"version":1,"peers":[{"to":"*","routes":{"huge":[{"subdevice":"tcp"}]}}]}`, `unknown class "huge"`},
		{"missing class", `{"version":1,"classes":[{"name":"a","max_bytes":9},{"name":"b"}],"peers":[{"to":"*","routes":{"a":[{"subdevice":"tcp"}]}}]}`, `no routes for class "b"`},
		{"bad selector", `{"version":1,"peers":[{"to":"rank:x","routes":{"*":[{"subdevice":"tcp"}]}}]}`, "rank:N"},
		{"duplicate selector", `{"version":1,"peers":[{"to":"*","routes":{"*":[{"subdevice":"tcp"}]}},{"to":"*","routes":{"*":[{"subdevice":"shm"}]}}]}`, "already has an entry"},
		{"empty subdevice", `{"version":1,"peers":[{"to":"*","routes":{"*":[{}]}}]}`, "subdevice is empty"},
		{"negative cost", `{"version":1,"peers":[{"to":"*","routes":{"*":[{"subdevice":"tcp","cost":-1}]}}]}`, "cost"},
		{"standby without failover", `{"version":1,"peers":[{"to":"*","routes":{"*":[{"subdevice":"ib"},{"subdevice":"tcp","standby":true}]}}]}`,
			`peers[0].routes.*[1].standby: a route stands by only in an entry with "failover": true`},
		{"all on standby", `{"version":1,"peers":[{"to":"*","failover":true,"routes":{"*":[{"subdevice":"tcp","standby":true}]}}]}`,
			"peers[0].routes.*: every route is on standby"},
		{"trailing", `{"version":1,"peers":[]} {}`, "trailing data"},
		{"trailing brace", `{"version":1,"peers":[]}}`, "trailing data"},
		{"trailing bracket", `{"version":1,"peers":[]}]`, "trailing data"},
		{"rank with a leading zero", `{"version":1,"peers":[{"to":"rank:05","routes":{"*":[{"subdevice":"tcp"}]}}]}`, "without sign or leading zeros"},
		{"rank with a sign", `{"version":1,"peers":[{"to":"rank:+5","routes":{"*":[{"subdevice":"tcp"}]}}]}`, "without sign or leading zeros"},
		{"rank minus zero", `{"version":1,"peers":[{"to":"rank:-0","routes":{"*":[{"subdevice":"tcp"}]}}]}`, "without sign or leading zeros"},
		{"via rank with a leading zero", `{"version":1,"peers":[{"to":"*","routes":{"*":[{"subdevice":"tcp","via":"rank:01"}]}}]}`, "without sign or leading zeros"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.src))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	only := &Table{Version: Version, Peers: []Entry{{To: SelectLocal, Routes: map[string][]Route{"*": {{SubDevice: "shm"}}}}}}
	if _, err := only.Resolve(0, []string{"a", "b"}); err == nil || !strings.Contains(err.Error(), `no entry covers rank 1 on host "b"`) {
		t.Errorf("uncovered rank: %v", err)
	}
	via := &Table{Version: Version, Peers: []Entry{{To: "*", Routes: map[string][]Route{"*": {{SubDevice: "tcp", Via: "gw"}}}}}}
	if _, err := via.Resolve(0, []string{"a", "b"}); err == nil || !strings.Contains(err.Error(), `via host "gw" runs no rank`) {
		t.Errorf("via a host without ranks: %v", err)
	}
	forHost := &Table{Version: Version, Host: "x", Peers: only.Peers}
	if _, err := forHost.Resolve(0, []string{"a"}); err == nil {
		t.Error("a table for host x resolved on host a")
	}
}

func TestDerive(t *testing.T) {
	tab, err := Derive([]Candidate{{Name: "tcp", Exclusivity: 10}, {Name: "shm", HostOnly: true, Exclusivity: 50}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tab.Resolve(0, []string{"h", "h", "g"})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Lookup(1, 1); got[0].SubDevice != "shm" || len(got) != 2 {
		t.Errorf("same host: %v", got)
	}
	if got := res.Lookup(2, 1); len(got) != 1 || got[0].SubDevice != "tcp" {
		t.Errorf("other host: %v", got)
	}
	if _, err := Derive(nil); err == nil {
		t.Error("derived a table from no subdevices")
	}
}

func TestSaveLoad(t *testing.T) {
	tab, err := Parse([]byte(mixed))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "t.json")
	if err := tab.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(tab, back) {
		t.Fatalf("round trip changed the table:\n%+v\n%+v", tab, back)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Fatal("loaded a missing file")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(mixed))
	f.Add([]byte(`{"version":1,"peers":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := Parse(data)
		if err != nil {
			return
		}
		out, err := tab.Encode()
		if err != nil {
			t.Fatalf("a parsed table does not encode: %v", err)
		}
		if _, err := Parse(out); err != nil {
			t.Fatalf("an encoded table does not parse: %v", err)
		}
		_, _ = tab.Resolve(0, []string{"a", "a", "b"})
	})
}
