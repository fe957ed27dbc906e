package adi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// FuzzBlockLengths: whatever bytes a rank receives where it expects its
// leader's block lengths, lengthsTotal either adds them up exactly or
// says ErrMismatch, and checkLengths either finds them to be those of
// the rank's own slices, exactly what putLengths would have sent for
// them, or says ErrMismatch; neither panics.
func FuzzBlockLengths(f *testing.F) {
	lens := func(spec []byte) [][]byte {
		recv := make([][]byte, len(spec)%9+1) // 1 to 9 remote ranks
		for r := range recv {
			if r < len(spec) {
				recv[r] = make([]byte, int(spec[r])%50)
			}
		}
		return recv
	}
	for _, spec := range [][]byte{{3, 0, 7}, {0}, {49, 49, 49, 49}} {
		blocks := lens(spec)
		b := make([]byte, blocksHeader*len(blocks))
		putLengths(b, blocks)
		f.Add(b, spec)
		f.Add(b[:len(b)-1], spec)
	}
	huge := make([]byte, 2*blocksHeader)
	binary.LittleEndian.PutUint64(huge, math.MaxInt)
	binary.LittleEndian.PutUint64(huge[blocksHeader:], 1)
	f.Add(huge, []byte{1})
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, b, spec []byte) {
		b = b[:len(b):len(b)] // nothing past its end to read by mistake
		total, err := lengthsTotal(b)
		switch {
		case err != nil && !errors.Is(err, ErrMismatch):
			t.Fatalf("lengthsTotal: %v, want ErrMismatch", err)
		case err == nil && total < 0:
			t.Fatalf("lengthsTotal: %d", total)
		}
		recv := lens(spec)
		if err := checkLengths(b, recv); err != nil {
			if !errors.Is(err, ErrMismatch) {
				t.Fatalf("checkLengths: %v, want ErrMismatch", err)
			}
			return
		}
		again := make([]byte, len(b))
		putLengths(again, recv)
		if !bytes.Equal(again, b) {
			t.Fatalf("%x checked as the lengths of blocks that give %x", b, again)
		}
		if n := len(bytes.Join(recv, nil)); err != nil || total != n {
			t.Fatalf("lengthsTotal: %d, %v; the blocks hold %d", total, err, n)
		}
	})
}

// TestBlockLengths: what a leader writes, its group adds up and checks,
// empty blocks included; another cut of the same total is a mismatch,
// naming the first block that differs.
func TestBlockLengths(t *testing.T) {
	blocks := [][]byte{[]byte("abc"), nil, []byte("de"), {}}
	b := make([]byte, blocksHeader*len(blocks))
	putLengths(b, blocks)
	if total, err := lengthsTotal(b); err != nil || total != 5 {
		t.Errorf("lengthsTotal: %d, %v; want 5", total, err)
	}
	if err := checkLengths(b, [][]byte{make([]byte, 3), nil, make([]byte, 2), nil}); err != nil {
		t.Error(err)
	}
	other := [][]byte{make([]byte, 3), make([]byte, 1), make([]byte, 1), nil}
	if err := checkLengths(b, other); !errors.Is(err, ErrMismatch) || !bytes.Contains([]byte(err.Error()), []byte("block of remote rank 1: ")) {
		t.Errorf("blocks cut otherwise: %v, want ErrMismatch naming remote rank 1", err)
	}
	if err := checkLengths(b, blocks[:3]); !errors.Is(err, ErrMismatch) {
		t.Errorf("fewer slices: %v, want ErrMismatch", err)
	}
}
