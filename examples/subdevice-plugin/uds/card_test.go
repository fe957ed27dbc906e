package uds

import (
	"errors"
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// FuzzDecodeCard checks that a peer's card either decodes into one that
// names a path, or fails as a card that gives no way to the peer.
func FuzzDecodeCard(f *testing.F) {
	good, err := card{Version: cardVersion, Host: "h1", Job: "j", Rank: 1, Path: "/tmp/uds-1"}.encode()
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{string(good), `{"v": 2, "path": "/x"}`, `{"v": 1}`, `{"v": 1, "path": "` + strings.Repeat("p", maxPathLen+1) + `"}`, `nul`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCard(b)
		if err != nil {
			if !errors.Is(err, sdi.ErrPeerUnreachable) || !strings.HasPrefix(err.Error(), "uds: card: ") {
				t.Fatalf("error %q: want a uds card error wrapping ErrPeerUnreachable", err)
			}
			return
		}
		if c.Version != cardVersion || c.Path == "" || len(c.Path) > maxPathLen {
			t.Fatalf("decodeCard(%q) accepted %+v", b, c)
		}
	})
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"", `{"dir": "/tmp", "queue_bytes": 1048576}`, `{"queue_bytes": 1}`, `{"dirs": "x"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseConfig(b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "uds: config: ") {
				t.Fatalf("error %q does not say where", err)
			}
			return
		}
		if c.QueueBytes < maxFrame {
			t.Fatalf("parseConfig(%q) accepted %+v", b, c)
		}
	})
}
