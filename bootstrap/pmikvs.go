package bootstrap

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// How a rank's keys and values live in a PMI manager's key-value store.
//
// The store is one namespace for the whole job, its keys and values are
// printable strings without spaces, and both have small limits (Hydra and
// Slurm: keys under 64 bytes, values under 1024). So a Put of (key, value)
// by rank r becomes one or more manager keys
//
//	md.<r>.k<base64url(key)>.<i>     or, for a key too long for that,
//	md.<r>.h<base64url(sha256(key)[:15])>.<i>
//
// holding chunk i of the value's unpadded base64url text. Chunk 0 starts
// with the number of chunks and a colon ("3:..."), so a reader knows how
// many to fetch after the first.

var b64 = base64.RawURLEncoding

// Limits of the chunk codec, so that a corrupt chunk count cannot make a
// reader fetch without end.
const (
	minChunkRoom = 32   // a manager allowing shorter values is not usable
	maxChunks    = 4096 // more than maxValue needs at minChunkRoom
)

// errBadChunk marks a value in the manager's store that this codec did not
// write.
var errBadChunk = errors.New("bootstrap: malformed value in the process manager's key-value store")

// wireKey is the manager key of chunk i of key published by rank. keyMax is
// the longest key the manager takes.
func wireKey(rank int, key string, i int, keyMax int) (string, error) {
	prefix := "md." + strconv.Itoa(rank) + "."
	suffix := "." + strconv.Itoa(i)
	k := prefix + "k" + b64.EncodeToString([]byte(key)) + suffix
	if len(k) <= keyMax {
		return k, nil
	}
	sum := sha256.Sum256([]byte(key))
	k = prefix + "h" + b64.EncodeToString(sum[:15]) + suffix
	if len(k) > keyMax {
		return "", fmt.Errorf("bootstrap: the process manager's keys of at most %d bytes cannot name %q", keyMax, key)
	}
	return k, nil
}

// encodeValue splits v into chunks of at most room bytes each.
func encodeValue(v []byte, room int) ([]string, error) {
	if room < minChunkRoom {
		return nil, fmt.Errorf("bootstrap: the process manager's values of at most %d bytes are too short (need %d)", room, minChunkRoom)
	}
	s := b64.EncodeToString(v)
	n := 1
	for {
		head := len(strconv.Itoa(n)) + 1
		if room-head+(n-1)*room >= len(s) {
			break
		}
		n++
	}
	if n > maxChunks {
		return nil, fmt.Errorf("bootstrap: value of %d bytes needs %d chunks, more than %d", len(v), n, maxChunks)
	}
	chunks := make([]string, n)
	first := room - len(strconv.Itoa(n)) - 1
	if first > len(s) {
		first = len(s)
	}
	chunks[0] = strconv.Itoa(n) + ":" + s[:first]
	s = s[first:]
	for i := 1; i < n; i++ {
		m := min(room, len(s))
		chunks[i] = s[:m]
		s = s[m:]
	}
	return chunks, nil
}

// chunkCount reads the chunk count at the head of chunk 0 and returns it
// with the rest of the chunk.
func chunkCount(first string) (int, string, error) {
	head, rest, ok := strings.Cut(first, ":")
	if !ok || head == "" || len(head) > 4 {
		return 0, "", fmt.Errorf("%w: no chunk count", errBadChunk)
	}
	n, err := strconv.Atoi(head)
	if err != nil || n < 1 || n > maxChunks {
		return 0, "", fmt.Errorf("%w: chunk count %q", errBadChunk, head)
	}
	return n, rest, nil
}

// decodeValue joins the chunks of one value (chunk 0 without its count) and
// decodes them.
func decodeValue(chunks []string) ([]byte, error) {
	total := 0
	for _, c := range chunks {
		total += len(c)
	}
	if total > b64.EncodedLen(maxValue) {
		return nil, fmt.Errorf("%w: %d bytes of text exceed the value limit", errBadChunk, total)
	}
	v, err := b64.DecodeString(strings.Join(chunks, ""))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBadChunk, err)
	}
	return v, nil
}
