package bootstrap

import (
	"context"
	"fmt"
	"sync"
)

// InProcess returns the bootstraps of a job whose size ranks all live in
// this process (ranks as goroutines: tests, and programs that run several
// ranks per process). hostOf names each rank's host; nil puts every rank on
// host "localhost". The job id and secret are random. As under mdrun, once
// a rank has closed or aborted, every fence not yet complete fails naming
// it: none can complete without it.
func InProcess(size int, hostOf func(rank int) string) ([]Bootstrap, error) {
	if size < 1 {
		return nil, fmt.Errorf("bootstrap: in-process job of %d ranks", size)
	}
	id, secret, err := newJobIdentity()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: in-process: %w", err)
	}
	j := &inJob{size: size, jobID: id, secret: secret, published: make([]map[string][]byte, size)}
	j.cond = sync.NewCond(&j.mu)
	out := make([]Bootstrap, size)
	for r := range size {
		host := "localhost"
		if hostOf != nil {
			host = hostOf(r)
		}
		j.published[r] = map[string][]byte{}
		out[r] = &inRank{job: j, rank: r, host: host, pending: map[string][]byte{}}
	}
	return out, nil
}

// inJob is the state the ranks of an in-process job share, guarded by mu.
type inJob struct {
	size   int
	jobID  string
	secret []byte

	mu        sync.Mutex
	cond      *sync.Cond
	published []map[string][]byte
	arrived   int    // ranks in the current fence
	epoch     uint64 // completed fences
	// left says why no fence can complete any more: a rank closed or
	// aborted. The first reason stays, as under mdrun.
	left error
}

type inRank struct {
	job  *inJob
	rank int
	host string

	mu      sync.Mutex
	pending map[string][]byte
	closed  bool
}

func (r *inRank) Rank() int      { return r.rank }
func (r *inRank) Size() int      { return r.job.size }
func (r *inRank) Host() string   { return r.host }
func (r *inRank) JobID() string  { return r.job.jobID }
func (r *inRank) Secret() []byte { return r.job.secret }

func (r *inRank) Put(key string, value []byte) error {
	if err := checkPut(key, value); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("bootstrap: put: %w", ErrClosed)
	}
	r.pending[key] = append([]byte(nil), value...)
	return nil
}

func (r *inRank) Fence(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bootstrap: fence: %w", err)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("bootstrap: fence: %w", ErrClosed)
	}
	puts := r.pending
	r.pending = map[string][]byte{}
	r.mu.Unlock()

	j := r.job
	stop := context.AfterFunc(ctx, func() {
		j.mu.Lock()
		j.cond.Broadcast()
		j.mu.Unlock()
	})
	defer stop()
	j.mu.Lock()
	defer j.mu.Unlock()
	// Before the arrival counts: it might be the last one, and a barrier
	// that a rank left must not complete.
	if j.left != nil {
		return fmt.Errorf("bootstrap: fence: %w", j.left)
	}
	for k, v := range puts {
		j.published[r.rank][k] = v
	}
	epoch := j.epoch
	j.arrived++
	if j.arrived == j.size {
		j.arrived = 0
		j.epoch++
		j.cond.Broadcast()
		return nil
	}
	// The epoch is checked first: a rank that leaves after the barrier
	// completed does not fail the ranks that have yet to wake from it.
	for j.epoch == epoch {
		if j.left != nil {
			return fmt.Errorf("bootstrap: fence: %w", j.left)
		}
		if err := ctx.Err(); err != nil {
			j.arrived--
			return fmt.Errorf("bootstrap: fence: %w", err)
		}
		j.cond.Wait()
	}
	return nil
}

func (r *inRank) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bootstrap: get: %w", err)
	}
	if rank < 0 || rank >= r.job.size {
		return nil, fmt.Errorf("bootstrap: get: rank %d not in a world of %d", rank, r.job.size)
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("bootstrap: get: %w", ErrClosed)
	}
	r.job.mu.Lock()
	defer r.job.mu.Unlock()
	v, ok := r.job.published[rank][key]
	if !ok {
		return nil, fmt.Errorf("bootstrap: get %q of rank %d: %w", key, rank, ErrNotFound)
	}
	return append([]byte(nil), v...), nil
}

// Abort fails the fences of every rank of the job with the reason.
func (r *inRank) Abort(code int, reason string) error {
	r.job.leave(fmt.Errorf("%w: rank %d aborted with code %d: %s", ErrClosed, r.rank, exitCode(code), reason))
	return nil
}

// Close fails the fences of the other ranks, waiting or to come, as the
// mdrun service does: none can complete without this rank.
func (r *inRank) Close() error {
	r.mu.Lock()
	closed := r.closed
	r.closed = true
	r.mu.Unlock()
	if !closed {
		r.job.leave(fmt.Errorf("%w: rank %d closed; the fence cannot complete", ErrClosed, r.rank))
	}
	return nil
}

// leave records why no fence can complete any more, unless an earlier
// reason is recorded, and wakes the ranks waiting in one.
func (j *inJob) leave(why error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.left == nil {
		j.left = why
	}
	j.cond.Broadcast()
}
