package adi

import "context"

// RunRelay makes this process a dedicated relay of the job its environment
// names: a rank of the launcher's job, placed after the application's ranks,
// that takes no application rank and only forwards for ranks that have no
// direct link to each other (GridMPI's front-end relay; see the multidevice
// package). It reads the same configuration as Init (MD_PLUGINS,
// MD_CONNTABLE, MD_FORWARD_*; opts override them) and returns when every
// rank of the job has finalized, or with an error when ctx ends first.
// cmd/mdrelay is a main around it.
func RunRelay(ctx context.Context, opts ...Option) error {
	opts = append(opts, func(c *config) { c.relay = true })
	w, err := Init(ctx, opts...)
	if err != nil {
		return err
	}
	return w.Finalize(ctx)
}
