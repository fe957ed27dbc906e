package shm

import (
	"bytes"
	"strings"
	"testing"
)

func TestCardRoundTrip(t *testing.T) {
	tests := []card{
		{Host: "node1", JobID: "job-42", Rank: 3, Segment: "mdshm.abc.r3.0011"},
		{Host: "", JobID: "", Rank: 0, Segment: "s"},
		{Host: strings.Repeat("h", maxHostLen), JobID: strings.Repeat("j", maxJobLen), Rank: 1<<31 - 1, Segment: "x"},
	}
	for _, c := range tests {
		b, err := c.encode()
		if err != nil {
			t.Fatalf("encode %+v: %v", c, err)
		}
		got, err := decodeCard(b)
		if err != nil || got != c {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", c, got, err)
		}
	}
}

func TestCardEncodeRejects(t *testing.T) {
	for _, c := range []card{
		{Host: strings.Repeat("h", maxHostLen+1), Segment: "s"},
		{JobID: strings.Repeat("j", maxJobLen+1), Segment: "s"},
		{Segment: "../../etc/passwd"},
		{Segment: ""},
	} {
		if _, err := c.encode(); err == nil {
			t.Errorf("encode(%+v) succeeded", c)
		}
	}
}

func TestDecodeCardRejects(t *testing.T) {
	good, err := card{Host: "h", JobID: "j", Rank: 1, Segment: "seg"}.encode()
	if err != nil {
		t.Fatal(err)
	}
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	tests := map[string][]byte{
		"empty":          nil,
		"short":          good[:9],
		"bad magic":      mutate(func(b []byte) []byte { b[0] = 'X'; return b }),
		"bad version":    mutate(func(b []byte) []byte { b[4] = 9; return b }),
		"reserved set":   mutate(func(b []byte) []byte { b[5] = 1; return b }),
		"negative rank":  mutate(func(b []byte) []byte { b[9] = 0x80; return b }),
		"truncated":      good[:len(good)-1],
		"trailing bytes": append(bytes.Clone(good), 0),
		"length too big": mutate(func(b []byte) []byte { b[10] = 0xff; return b }),
		"path in segment": func() []byte {
			b, _ := card{Host: "h", JobID: "j", Rank: 1, Segment: "seg"}.encode()
			return append(b[:len(b)-5], 5, 0, '.', '.', '/', 'x', 'y')
		}(),
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if c, err := decodeCard(b); err == nil {
				t.Fatalf("decodeCard accepted %x as %+v", b, c)
			}
		})
	}
}

// FuzzDecodeCard: any bytes a peer publishes must decode or fail cleanly,
// and a card that decodes re-encodes to the same bytes (one encoding per card).
func FuzzDecodeCard(f *testing.F) {
	good, _ := card{Host: "node1", JobID: "job", Rank: 2, Segment: "mdshm.x.r2.00"}.encode()
	f.Add(good)
	f.Add([]byte("MDSC"))
	f.Add([]byte{})
	f.Add(append([]byte("MDSC\x01\x00\x00\x00\x00\x00"), 0xff, 0xff))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCard(b)
		if err != nil {
			return
		}
		again, err := c.encode()
		if err != nil {
			t.Fatalf("decoded card %+v does not encode: %v", c, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding %+v gives %x, input was %x", c, again, b)
		}
	})
}
