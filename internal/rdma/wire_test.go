package rdma

import (
	"bytes"
	"errors"
	"testing"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// encode builds a message the way the send path does.
func encode(h wireHeader, r rts, token uint64, header, payload []byte) []byte {
	b := make([]byte, baseLen, baseLen+rtsLen+len(header)+len(payload))
	switch h.kind {
	case kindEager:
		h.hdrLen = uint16(len(header))
		b = append(append(b, header...), payload...)
	case kindRTS:
		h.hdrLen = uint16(len(header))
		b = append(b, make([]byte, rtsLen)...)
		putRTS(b[baseLen:], r)
		b = append(b, header...)
	case kindFIN:
		b = append(b, make([]byte, finLen)...)
		putUint64(b[baseLen:], token)
	}
	putBase(b, h)
	return b
}

func TestDecodeRejects(t *testing.T) {
	const eager, maxFrame = 1024, 1 << 20
	good := encode(wireHeader{kind: kindRTS}, rts{token: 1, addr: 4096, rkey: 9, n: 4096}, 0, []byte("hdr"), nil)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"short", []byte{1, 0, 0}},
		{"unknown kind", encode(wireHeader{kind: 99}, rts{}, 0, nil, nil)},
		{"reserved bytes", func() []byte { b := encode(wireHeader{kind: kindCredit}, rts{}, 0, nil, nil); b[7] = 1; return b }()},
		{"too many control slots back", encode(wireHeader{kind: kindCredit, ctlBack: ctlSlots + 1}, rts{}, 0, nil, nil)},
		{"eager header beyond message", func() []byte {
			b := encode(wireHeader{kind: kindEager}, rts{}, 0, []byte("ab"), nil)
			b[4] = 50
			return b
		}()},
		{"eager payload too big", encode(wireHeader{kind: kindEager}, rts{}, 0, nil, make([]byte, eager+1))},
		{"rts of an eager size", encode(wireHeader{kind: kindRTS}, rts{n: eager}, 0, nil, nil)},
		{"rts beyond max frame", encode(wireHeader{kind: kindRTS}, rts{n: maxFrame + 1}, 0, nil, nil)},
		{"rts region wraps", encode(wireHeader{kind: kindRTS}, rts{addr: ^uint64(0) - 10, n: 4096}, 0, nil, nil)},
		{"rts cut short", good[:len(good)-1]},
		{"fin with a header", func() []byte { b := encode(wireHeader{kind: kindFIN}, rts{}, 7, nil, nil); b[4] = 1; return b }()},
		{"credit with a body", append(encode(wireHeader{kind: kindCredit}, rts{}, 0, nil, nil), 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decode(tc.b, eager, maxFrame); !errors.Is(err, sdi.ErrBadFrame) {
				t.Fatalf("decode: %v, want ErrBadFrame", err)
			}
		})
	}
	if _, err := decode(good, eager, maxFrame); err != nil {
		t.Fatalf("a good rts: %v", err)
	}
}

// FuzzDecode: decode never panics, whatever arrives, and what the send
// path encodes comes back the same.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{kindEager, 0, 1, 0, 2, 0, 0, 0, 'h', 'i', 'x'}, uint8(kindEager), uint64(5), []byte("hdr"), []byte("payload"))
	f.Add([]byte{}, uint8(kindRTS), uint64(1<<16), []byte("h"), []byte(nil))
	f.Add([]byte{kindFIN, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, uint8(kindFIN), uint64(3), []byte(nil), []byte(nil))
	const eager, maxFrame = 1024, 1 << 20
	f.Fuzz(func(t *testing.T, raw []byte, kind uint8, v uint64, header, payload []byte) {
		decode(raw, eager, maxFrame)

		k := kindEager + kind%5
		if len(header) > MaxHeader {
			header = header[:MaxHeader]
		}
		if len(payload) > eager {
			payload = payload[:eager]
		}
		h := wireHeader{kind: k, ctlBack: uint8(v % (ctlSlots + 1)), credits: uint16(v >> 8)}
		r := rts{token: v, addr: v >> 20, rkey: uint32(v), n: eager + 1 + v%(maxFrame-eager)}
		b := encode(h, r, v, header, payload)
		m, err := decode(b, eager, maxFrame)
		if err != nil {
			t.Fatalf("decode of an encoded %s: %v", kindName(k), err)
		}
		if m.kind != k || m.ctlBack != h.ctlBack || m.credits != h.credits {
			t.Fatalf("header %+v came back as %+v", h, m.wireHeader)
		}
		switch k {
		case kindEager:
			if !bytes.Equal(m.header, header) || !bytes.Equal(m.payload, payload) {
				t.Fatalf("eager frame %q+%q came back as %q+%q", header, payload, m.header, m.payload)
			}
		case kindRTS:
			if m.rts != r || !bytes.Equal(m.header, header) {
				t.Fatalf("rts %+v %q came back as %+v %q", r, header, m.rts, m.header)
			}
		case kindFIN:
			if m.token != v {
				t.Fatalf("fin %d came back as %d", v, m.token)
			}
		}
	})
}

func TestHandshake(t *testing.T) {
	good := makePrivate([]byte("secret"), "job", 3, 1)
	if from, err := checkPrivate(append(good, 0, 0), []byte("secret"), "job", 1, 4); err != nil || from != 3 {
		t.Fatalf("a good request, padded: %d, %v", from, err)
	}
	flip := func(i int) []byte { b := bytes.Clone(good); b[i] ^= 1; return b }
	for _, tc := range []struct {
		name   string
		b      []byte
		secret string
		job    string
		me     sdi.Rank
		size   int
	}{
		{"short", good[:privateLen-1], "secret", "job", 1, 4},
		{"magic", flip(0), "secret", "job", 1, 4},
		{"version", flip(4), "secret", "job", 1, 4},
		{"forged rank", flip(8), "secret", "job", 1, 4},
		{"other secret", good, "other", "job", 1, 4},
		{"other job", good, "secret", "job2", 1, 4},
		{"meant for another rank", good, "secret", "job", 2, 4},
		{"from outside the job", good, "secret", "job", 1, 3},
		{"from ourselves", makePrivate([]byte("secret"), "job", 1, 1), "secret", "job", 1, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if from, err := checkPrivate(tc.b, []byte(tc.secret), tc.job, tc.me, tc.size); err == nil {
				t.Fatalf("accepted, from rank %d", from)
			}
		})
	}
}

func TestCard(t *testing.T) {
	secret, job := []byte("secret"), "job"
	card := makeCard(secret, job, 3, []byte("provider"))
	if prov, err := openCard(card, secret, job, 3); err != nil || string(prov) != "provider" {
		t.Fatalf("a good card: %q, %v", prov, err)
	}
	for _, tc := range []struct {
		name   string
		b      []byte
		secret string
		job    string
		peer   sdi.Rank
	}{
		{"empty", nil, "secret", "job", 3},
		{"no provider card", card[:cardHead], "secret", "job", 3},
		{"not ours", []byte("tcp card, long enough to look like one"), "secret", "job", 3},
		{"another rank's", card, "secret", "job", 2},
		{"another job's", card, "secret", "job2", 3},
		{"another secret's", card, "other", "job", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := openCard(tc.b, []byte(tc.secret), tc.job, tc.peer); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// FuzzOpenCard: any bytes as a peer's card give a provider card or an
// error, never a panic; a card made for a rank opens for that rank only.
func FuzzOpenCard(f *testing.F) {
	f.Add(makeCard([]byte("s"), "j", 1, []byte{1, 2, 3}), int32(1), []byte{9})
	f.Add([]byte("MDRC"), int32(0), []byte(nil))
	f.Fuzz(func(t *testing.T, raw []byte, rank int32, prov []byte) {
		openCard(raw, []byte("s"), "j", sdi.Rank(rank))
		if len(prov) == 0 {
			return
		}
		card := makeCard([]byte("s"), "j", sdi.Rank(rank), prov)
		got, err := openCard(card, []byte("s"), "j", sdi.Rank(rank))
		if err != nil || !bytes.Equal(got, prov) {
			t.Fatalf("card for rank %d with %x: %x, %v", rank, prov, got, err)
		}
		if _, err := openCard(card, []byte("s"), "j", sdi.Rank(rank)+1); err == nil {
			t.Fatalf("card for rank %d opened for rank %d", rank, rank+1)
		}
	})
}
