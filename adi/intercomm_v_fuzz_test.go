package adi

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzUnpackBlocks: whatever bytes a rank receives where it expects its
// leader's packed blocks, unpackBlocks either fills its slices with
// exactly what packBlocks would have sent for them, or says ErrMismatch;
// it never panics.
func FuzzUnpackBlocks(f *testing.F) {
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
		for r, b := range blocks {
			for i := range b {
				b[i] = byte(r + i)
			}
		}
		packed := make([]byte, blocksHeader*len(blocks)+len(bytes.Join(blocks, nil)))
		packBlocks(packed, blocks)
		f.Add(packed, spec)
		f.Add(packed[:len(packed)-1], spec)
	}
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, b, spec []byte) {
		b = b[:len(b):len(b)] // nothing past its end to read by mistake
		recv := lens(spec)
		err := unpackBlocks(b, recv)
		if err != nil {
			if !errors.Is(err, ErrMismatch) {
				t.Fatalf("%v, want ErrMismatch", err)
			}
			return
		}
		again := make([]byte, len(b))
		packBlocks(again, recv)
		if !bytes.Equal(again, b) {
			t.Fatalf("unpacked %x into blocks that pack to %x", b, again)
		}
	})
}

// TestPackBlocks: what a leader packs, its group unpacks, empty blocks
// included; another cut of the same bytes is a mismatch.
func TestPackBlocks(t *testing.T) {
	blocks := [][]byte{[]byte("abc"), nil, []byte("de"), {}}
	packed := make([]byte, blocksHeader*len(blocks)+5)
	packBlocks(packed, blocks)
	recv := [][]byte{make([]byte, 3), nil, make([]byte, 2), nil}
	if err := unpackBlocks(packed, recv); err != nil {
		t.Fatal(err)
	}
	for r := range blocks {
		if !bytes.Equal(recv[r], blocks[r]) {
			t.Errorf("block %d: %q, want %q", r, recv[r], blocks[r])
		}
	}
	other := [][]byte{make([]byte, 2), make([]byte, 1), make([]byte, 2), nil}
	if err := unpackBlocks(packed, other); !errors.Is(err, ErrMismatch) {
		t.Errorf("blocks cut otherwise: %v, want ErrMismatch", err)
	}
}
