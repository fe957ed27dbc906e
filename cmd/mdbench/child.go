package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/internal/loglevel"
	"github.com/hpc-multidevice/multidevice/multidevice"
)

// childEnv carries a rank's job (JSON) from the launching mdbench to the
// ranks it starts; its presence makes main run a rank.
const childEnv = "MDBENCH_CHILD"

// profileEnv names a directory where every rank writes a CPU profile,
// rank<N>.<pid>.pprof, for `go tool pprof`.
const profileEnv = "MDBENCH_CPUPROFILE"

// resultPrefix starts every result line a rank prints on stdout.
const resultPrefix = "MDBENCH "

// childJob is what one launch of ranks measures.
type childJob struct {
	Tests       []string `json:"tests"` // lat, bw, bibw, mr, idle, or collTests
	Sizes       []int    `json:"sizes"`
	Window      int      `json:"window"`
	Scale       float64  `json:"scale"`
	Sub         string   `json:"sub,omitempty"`       // only this subdevice; "" means plugins file or default
	Plugins     string   `json:"plugins,omitempty"`   // plugins.hcl path
	ConnTable   string   `json:"conntable,omitempty"` // connection table path
	Direct      bool     `json:"direct,omitempty"`    // drive Sub through sdi alone
	IdleSeconds float64  `json:"idle_seconds,omitempty"`
	// Hosts above 1 says the ranks run on that many pretend hosts (see
	// placement), so that tcp is opened under the machine's host name
	// (see machineHost).
	Hosts int `json:"hosts,omitempty"`
	// Env is added to the ranks' environment (-vs-env); the ranks get it
	// as environment, not in this description.
	Env []string `json:"-"`
	// Exe, if set, is the mdbench binary that runs the ranks (-vs-build)
	// instead of this one.
	Exe string `json:"-"`
}

// sample is one measured figure, as a rank reports it.
type sample struct {
	Test  string  `json:"test"`
	Size  int     `json:"size"`
	Value float64 `json:"value"`
}

func childMain() int {
	var j childJob
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &j); err != nil {
		fmt.Fprintf(os.Stderr, "mdbench rank: bad %s: %v\n", childEnv, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	logger := hclog.New(&hclog.LoggerOptions{Name: "mdbench", Level: loglevel.FromEnv("MD_LOG_LEVEL", hclog.Warn, os.Stderr), Output: os.Stderr})
	emit := func(s sample) {
		b, _ := json.Marshal(s) // a struct of plain fields always marshals
		fmt.Printf("%s%s\n", resultPrefix, b)
	}
	if dir := os.Getenv(profileEnv); dir != "" {
		stop, err := startProfile(dir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mdbench rank: %v\n", err)
			return 1
		}
		defer stop()
	}
	var err error
	if j.Direct {
		err = runDirect(ctx, j, logger, emit)
	} else {
		err = runMultidevice(ctx, j, logger, emit)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mdbench rank: %v\n", err)
		return 1
	}
	return 0
}

// runMultidevice runs the job's tests through adi.
func runMultidevice(ctx context.Context, j childJob, logger hclog.Logger, emit func(sample)) error {
	opts := []adi.Option{adi.WithLogger(logger)}
	var plugins *multidevice.PluginsConfig // nil: adi's default or MD_PLUGINS
	switch {
	case j.Sub != "":
		plugins = &multidevice.PluginsConfig{SubDevices: []multidevice.SubDeviceSpec{{Name: j.Sub, Enabled: true}}}
		opts = append(opts, adi.WithPlugins(plugins))
	case j.Plugins != "":
		var err error
		if plugins, err = multidevice.LoadPlugins(j.Plugins); err != nil {
			return err
		}
		opts = append(opts, adi.WithPluginsFile(j.Plugins))
	}
	if j.Hosts > 1 {
		more, err := machineHostFactories(plugins)
		if err != nil {
			return fmt.Errorf("pretend hosts: %w", err)
		}
		opts = append(opts, more...)
	}
	if j.ConnTable != "" {
		opts = append(opts, adi.WithConnTableFile(j.ConnTable))
	}
	w, err := adi.Init(ctx, opts...)
	if err != nil {
		return err
	}
	c := w.Comm()
	send, recv := bufLens(j.Tests, j.Sizes, j.Window)
	m := &mdRank{c: c, scale: j.Scale, sbuf: make([]byte, send), rbuf: make([]byte, recv)}
	for i := range m.sbuf {
		m.sbuf[i] = byte(i)
	}
	for _, test := range j.Tests {
		if err := checkPairs(test, c.Size()); err != nil {
			return err
		}
		if test == "idle" {
			v, err := m.idle(ctx, j.IdleSeconds)
			if err != nil {
				return fmt.Errorf("idle: %w", err)
			}
			if c.Rank() == 1 {
				emit(sample{Test: test, Size: 8, Value: v})
			}
			continue
		}
		for _, size := range collSizes(test, j.Sizes) {
			var v float64
			switch test {
			case "lat":
				v, err = m.lat(ctx, size)
			case "bw":
				v, err = m.stream(ctx, 0, 1, size, j.Window, false)
			case "bibw":
				v, err = m.stream(ctx, 0, 1, size, j.Window, true)
			case "mr":
				v, err = m.rate(ctx, size, j.Window)
			default:
				// collective refuses a test it does not know.
				v, err = m.collective(ctx, test, size)
			}
			if err != nil {
				return fmt.Errorf("%s at %d bytes: %w", test, size, err)
			}
			if c.Rank() == 0 {
				emit(sample{Test: test, Size: size, Value: v})
			}
		}
	}
	// What the subdevices carried, for the launcher to check the placement
	// on pretend hosts with: counted before Finalize, which closes them.
	rl := rankLinks{Rank: c.Rank(), Host: w.Host(), Links: []link{}}
	for _, l := range w.Stats() {
		rl.Links = append(rl.Links, link{Peer: l.Peer, SubDevice: l.SubDevice, Frames: l.Frames, Bytes: l.Bytes})
	}
	b, _ := json.Marshal(rl) // plain fields always marshal
	fmt.Printf("%s%s\n", linksPrefix, b)
	return w.Finalize(ctx)
}

func startProfile(dir string) (func(), error) {
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("rank%s.%d.pprof", os.Getenv("MDRUN_RANK"), os.Getpid())))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// cpuTime is the user plus system time this process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
