// Command coupling is two programs coupled into one job, as codes of
// different teams are (an ocean and an atmosphere, a solver and its
// monitor), each possibly on a cluster of its own:
//
//	bin/mdrun -n 3 bin/coupling : -n 2 bin/coupling
//
// mdrun numbers the programs of the command line 0 and 1 (World.AppNum).
// Program 0 is a solver: its ranks share a rod of cells and step the heat
// equation along it, exchanging halo cells with their neighbours. Program
// 1 is a monitor: every few steps the solver hands it the whole rod over
// an intercommunicator (Intercomm.Gather), and the monitor's first rank
// checks the rod against its own serial run, bit for bit, and decides
// whether the solver goes on (Intercomm.Bcast the other way): it stops
// the solver once the rod is nearly even. At the end
// both programs merge into one communicator (Intercomm.Merge) and agree
// on the outcome with one Allreduce.
//
// The two programs are one binary here, so that the example builds with
// one command; they could as well be two (`mdrun -n 3 solver : -n 2
// monitor`), written by different people, as long as they call the same
// collectives on the intercommunicator in the same order.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/hpc-multidevice/multidevice/adi"
)

// Tags on the world communicator and within the solver.
const (
	tagIntercomm = 1 // the leaders' handshake in IntercommCreate
	tagHalo      = 2
)

func main() {
	cells := flag.Int("cells", 24, "cells of the rod per solver rank")
	steps := flag.Int("steps", 20000, "most steps the solver takes")
	every := flag.Int("every", 500, "steps between the monitor's checks")
	even := flag.Float64("even", 0.05, "the monitor stops the solver once the hottest and the coldest cell differ by less than this")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, *cells, *steps, *every, *even); err != nil {
		fmt.Fprintln(os.Stderr, "coupling:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cells, steps, every int, even float64) error {
	if cells < 1 || steps < 1 || every < 1 {
		return fmt.Errorf("-cells %d, -steps %d, -every %d: each must be at least 1", cells, steps, every)
	}
	w, err := adi.Init(ctx)
	if err != nil {
		return err
	}
	defer w.Finalize(ctx)
	world := w.Comm()
	app := w.AppNum()
	// Every rank learns every rank's program and settings, so that all
	// refuse alike a job that is not two programs, or whose programs were
	// given different -cells, -steps or -every (each program of an MPMD
	// job takes flags of its own); and each finds the other program's
	// first rank in the world: its leader in the intercommunicator.
	mine := []int64{int64(app), int64(cells), int64(steps), int64(every)}
	settings := make([]int64, len(mine)*world.Size())
	if err := world.Allgather(ctx, adi.Bytes(mine), adi.Bytes(settings)); err != nil {
		return err
	}
	remoteLeader := -1
	for r := range world.Size() {
		got := settings[len(mine)*r : len(mine)*(r+1)]
		if got[0] > 1 {
			return fmt.Errorf("rank %d runs program %d: this job couples two programs, run it as mdrun -n S coupling : -n M coupling", r, got[0])
		}
		if got[1] != settings[1] || got[2] != settings[2] || got[3] != settings[3] {
			return fmt.Errorf("rank %d runs with -cells %d -steps %d -every %d, rank 0 with -cells %d -steps %d -every %d: give both programs the same",
				r, got[1], got[2], got[3], settings[1], settings[2], settings[3])
		}
		if int(got[0]) != app && remoteLeader < 0 {
			remoteLeader = r
		}
	}
	if remoteLeader < 0 {
		return errors.New("one program only: run it as mdrun -n S coupling : -n M coupling")
	}
	local, err := world.Split(ctx, app, world.Rank())
	if err != nil {
		return err
	}
	ic, err := local.IntercommCreate(ctx, 0, world, remoteLeader, tagIntercomm)
	if err != nil {
		return err
	}
	var outcome error
	if app == 0 {
		outcome = solve(ctx, local, ic, cells, steps, every)
	} else {
		outcome = monitor(ctx, local, ic, cells, steps, every, even)
	}
	// Both programs in one communicator, the solver's ranks first: every
	// rank learns whether any rank of either program failed.
	all, err := ic.Merge(ctx, app == 1)
	if err != nil {
		return errors.Join(outcome, err)
	}
	failed := []int32{0}
	if outcome != nil {
		failed[0] = 1
	}
	if err := adi.Allreduce(ctx, all, failed, failed, adi.Max); err != nil {
		return errors.Join(outcome, err)
	}
	switch {
	case outcome != nil:
		return outcome
	case failed[0] != 0:
		return errors.New("a rank of the other program failed")
	}
	return nil
}

// initial is the rod before the first step: a hot band in the middle.
func initial(n int) []float64 {
	u := make([]float64, n)
	for i := n * 2 / 5; i < n*3/5; i++ {
		u[i] = 1
	}
	return u
}

// step advances u (with ghost cells u[0] and u[len-1] already set) by one
// explicit step of the heat equation into next.
func step(u, next []float64) {
	const alpha = 0.25
	for i := 1; i < len(u)-1; i++ {
		next[i] = u[i] + alpha*(u[i-1]-2*u[i]+u[i+1])
	}
}

// solve is a solver rank: cells of the rod, halos from the neighbours,
// and at every check the rod to the monitor and its verdict back.
func solve(ctx context.Context, c *adi.Comm, ic *adi.Intercomm, cells, steps, every int) error {
	me, n := c.Rank(), c.Size()
	rod := initial(n * cells)
	u := make([]float64, cells+2) // with a ghost cell at each end
	copy(u[1:], rod[me*cells:(me+1)*cells])
	next := make([]float64, len(u))
	left, right := me-1, me+1
	if left < 0 {
		left = adi.ProcNull
	}
	if right >= n {
		right = adi.ProcNull
	}
	out := make([]byte, 8*cells)
	verdict := make([]byte, 1)
	for s := 1; s <= steps; s++ {
		// The rod's ends are insulated: a ghost past an end mirrors the
		// end cell, and ProcNull leaves it so.
		u[0], u[cells+1] = u[1], u[cells]
		if _, err := c.Sendrecv(ctx, adi.Bytes(u[1:2]), left, tagHalo, adi.Bytes(u[cells+1:]), right, tagHalo); err != nil {
			return err
		}
		if _, err := c.Sendrecv(ctx, adi.Bytes(u[cells:cells+1]), right, tagHalo, adi.Bytes(u[:1]), left, tagHalo); err != nil {
			return err
		}
		step(u, next)
		u, next = next, u
		if s%every != 0 && s != steps {
			continue
		}
		for i, x := range u[1 : cells+1] {
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(x))
		}
		if err := ic.Gather(ctx, out, nil, 0); err != nil {
			return err
		}
		if err := ic.Bcast(ctx, verdict, 0); err != nil {
			return err
		}
		if verdict[0] == stop {
			return nil
		}
		if verdict[0] == wrong {
			return fmt.Errorf("solver rank %d: the monitor found the rod wrong after step %d", me, s)
		}
	}
	return nil
}

// The monitor's verdicts.
const (
	goOn byte = iota
	stop
	wrong
)

// monitor is a monitor rank. Its first rank receives the rod at every
// check, steps its own serial copy alongside, and tells the solver
// whether to go on; the others take no part (ProcNull).
func monitor(ctx context.Context, c *adi.Comm, ic *adi.Intercomm, cells, steps, every int, even float64) error {
	if c.Rank() != 0 {
		for s := 1; s <= steps; s++ {
			if s%every != 0 && s != steps {
				continue
			}
			if err := ic.Gather(ctx, nil, nil, adi.ProcNull); err != nil {
				return err
			}
			verdict := []byte{0}
			if err := ic.Bcast(ctx, verdict, adi.ProcNull); err != nil {
				return err
			}
			// Only rank 0 knows the verdict: ask it.
			if err := c.Bcast(ctx, verdict, 0); err != nil {
				return err
			}
			if verdict[0] != goOn {
				return nil
			}
		}
		return nil
	}
	n := ic.RemoteSize() * cells
	ref := make([]float64, n+2)
	copy(ref[1:], initial(n))
	next := make([]float64, len(ref))
	got := make([]byte, 8*n)
	heat := sum(ref[1 : n+1])
	for s := 1; s <= steps; s++ {
		ref[0], ref[n+1] = ref[1], ref[n]
		step(ref, next)
		ref, next = next, ref
		if s%every != 0 && s != steps {
			continue
		}
		verdict, hottest, coldest := goOn, math.Inf(-1), math.Inf(1)
		// A failed Gather is a verdict too: the solver and the other
		// monitor ranks wait for one.
		gerr := ic.Gather(ctx, nil, got, adi.Root)
		if gerr != nil {
			verdict = wrong
		}
		for i := range n {
			if gerr != nil {
				break
			}
			x := math.Float64frombits(binary.LittleEndian.Uint64(got[8*i:]))
			if x != ref[1+i] {
				verdict = wrong
				fmt.Printf("coupling: step %d: cell %d is %v, the serial run has %v\n", s, i, x, ref[1+i])
				break
			}
			hottest, coldest = max(hottest, x), min(coldest, x)
		}
		if verdict == goOn {
			fmt.Printf("coupling: step %d: cells from %.4f to %.4f, heat %.6f (%.6f at the start)\n", s, coldest, hottest, sum(ref[1:n+1]), heat)
			if hottest-coldest < even || s == steps {
				verdict = stop
			}
		}
		if err := ic.Bcast(ctx, []byte{verdict}, adi.Root); err != nil {
			return errors.Join(gerr, err)
		}
		if err := c.Bcast(ctx, []byte{verdict}, 0); err != nil {
			return errors.Join(gerr, err)
		}
		if gerr != nil {
			return fmt.Errorf("the solver's rod after step %d: %w", s, gerr)
		}
		switch verdict {
		case wrong:
			return fmt.Errorf("the solver's rod differs from the serial run after step %d", s)
		case stop:
			fmt.Printf("coupling: %d solver ranks, %d monitor ranks: stopped after step %d, every check matched the serial run\n",
				ic.RemoteSize(), c.Size(), s)
			return nil
		}
	}
	return nil
}

func sum(xs []float64) float64 {
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t
}
