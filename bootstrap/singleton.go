package bootstrap

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// newSingleton returns the world of one rank a program gets when no
// launcher started it: an in-process job of one, on this machine's host name.
func newSingleton() (Bootstrap, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: singleton: host name: %w", err)
	}
	bs, err := InProcess(1, func(int) string { return host })
	if err != nil {
		return nil, fmt.Errorf("bootstrap: singleton: %w", err)
	}
	return bs[0], nil
}

// newJobIdentity returns a random job id and secret.
func newJobIdentity() (string, []byte, error) {
	b := make([]byte, 8+32)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("random job identity: %w", err)
	}
	return hex.EncodeToString(b[:8]), b[8:], nil
}

// checkPut applies the wire limits in every backend, so a program that works
// as a singleton does not fail once launched.
func checkPut(key string, value []byte) error {
	if err := checkKey("put", key); err != nil {
		return err
	}
	if len(value) > maxValue {
		return fmt.Errorf("bootstrap: put %q: value of %d bytes exceeds %d", key, len(value), maxValue)
	}
	return nil
}

// checkKey applies the wire limits on a key to op's key.
func checkKey(op, key string) error {
	if key == "" || len(key) > maxKey {
		return fmt.Errorf("bootstrap: %s: key of %d bytes, want 1 to %d", op, len(key), maxKey)
	}
	return nil
}
