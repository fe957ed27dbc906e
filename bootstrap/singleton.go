package bootstrap

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
)

// singleton is the world of one rank a program gets when no launcher
// started it. It is safe for concurrent use.
type singleton struct {
	host   string
	jobID  string
	secret []byte

	mu        sync.Mutex
	closed    bool
	pending   map[string][]byte // Puts since the last Fence
	published map[string][]byte
}

func newSingleton() (*singleton, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: singleton: host name: %w", err)
	}
	id, secret, err := newJobIdentity()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: singleton: %w", err)
	}
	return &singleton{
		host:      host,
		jobID:     id,
		secret:    secret,
		pending:   map[string][]byte{},
		published: map[string][]byte{},
	}, nil
}

// newJobIdentity returns a random job id and secret.
func newJobIdentity() (string, []byte, error) {
	b := make([]byte, 8+32)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("random job identity: %w", err)
	}
	return hex.EncodeToString(b[:8]), b[8:], nil
}

func (s *singleton) Rank() int      { return 0 }
func (s *singleton) Size() int      { return 1 }
func (s *singleton) Host() string   { return s.host }
func (s *singleton) JobID() string  { return s.jobID }
func (s *singleton) Secret() []byte { return s.secret }

func (s *singleton) Put(key string, value []byte) error {
	if err := checkPut(key, value); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("bootstrap: put: %w", ErrClosed)
	}
	s.pending[key] = append([]byte(nil), value...)
	return nil
}

func (s *singleton) Fence(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bootstrap: fence: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("bootstrap: fence: %w", ErrClosed)
	}
	for k, v := range s.pending {
		s.published[k] = v
	}
	clear(s.pending)
	return nil
}

func (s *singleton) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bootstrap: get: %w", err)
	}
	if rank != 0 {
		return nil, fmt.Errorf("bootstrap: get: rank %d not in a world of 1", rank)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("bootstrap: get: %w", ErrClosed)
	}
	v, ok := s.published[key]
	if !ok {
		return nil, fmt.Errorf("bootstrap: get %q of rank 0: %w", key, ErrNotFound)
	}
	return append([]byte(nil), v...), nil
}

// Abort has no launcher to tell; the caller ends the process itself.
func (s *singleton) Abort(code int, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func (s *singleton) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// checkPut applies the wire limits in every backend, so a program that works
// as a singleton does not fail once launched.
func checkPut(key string, value []byte) error {
	if key == "" || len(key) > maxKey {
		return fmt.Errorf("bootstrap: put: key of %d bytes, want 1 to %d", len(key), maxKey)
	}
	if len(value) > maxValue {
		return fmt.Errorf("bootstrap: put %q: value of %d bytes exceeds %d", key, len(value), maxValue)
	}
	return nil
}
