package adi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/conntable"
	"github.com/hpc-multidevice/multidevice/internal/loglevel"
	"github.com/hpc-multidevice/multidevice/multidevice"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// World is an initialized job as seen by one rank. It is safe for
// concurrent use.
type World struct {
	dev  *multidevice.Device
	boot bootstrap.Bootstrap
	comm *Comm
	bg   background // nonblocking collectives, window servers: nbcoll.go
	// hostColl lets collectives go by hosts (hostcoll.go).
	hostColl bool
	appNum   int
}

type config struct {
	boot        bootstrap.Bootstrap
	logger      hclog.Logger
	pluginsPath string
	plugins     *multidevice.PluginsConfig
	tablePath   string
	table       *conntable.Table
	factories   map[string]sdi.Factory
	relay       bool // RunRelay: a dedicated relay, no application rank
	hostColl    *bool
	site        *string
	appNum      *int
}

// Option changes how Init sets the world up.
type Option func(*config)

// WithBootstrap uses b instead of the one the environment names; several
// ranks can then share one process.
func WithBootstrap(b bootstrap.Bootstrap) Option { return func(c *config) { c.boot = b } }

// WithLogger sends the library's logs to l instead of stderr at
// MD_LOG_LEVEL.
func WithLogger(l hclog.Logger) Option { return func(c *config) { c.logger = l } }

// WithPluginsFile reads the subdevice list from a plugins.hcl file instead
// of MD_PLUGINS.
func WithPluginsFile(path string) Option { return func(c *config) { c.pluginsPath = path } }

// WithPlugins uses an already decoded plugins.hcl.
func WithPlugins(p *multidevice.PluginsConfig) Option { return func(c *config) { c.plugins = p } }

// WithConnTableFile reads routes from a connection-table file, or from
// <dir>/<host>.json when path is a directory, instead of MD_CONNTABLE.
func WithConnTableFile(path string) Option { return func(c *config) { c.tablePath = path } }

// WithConnTable forces routes from a table value.
func WithConnTable(t *conntable.Table) Option { return func(c *config) { c.table = t } }

// WithSubDevice makes a subdevice factory available under name, ahead of the
// built-in ones (for tests and for subdevices linked into the program).
func WithSubDevice(name string, f sdi.Factory) Option {
	return func(c *config) {
		if c.factories == nil {
			c.factories = make(map[string]sdi.Factory)
		}
		c.factories[name] = f
	}
}

// WithHostCollectives chooses whether collectives on communicators that
// span several hosts work host by host (the default): within each host,
// then among one rank per host, then within each host again, so that
// fewer and larger messages cross between hosts. It overrides
// MD_HOST_COLLECTIVES (0 or 1 in the environment). The package
// documentation's section on collectives says which ones do. Every rank
// of a job must choose alike: ranks that go by hosts and ranks that do
// not wait for each other's messages until their ctx ends.
func WithHostCollectives(on bool) Option { return func(c *config) { c.hostColl = &on } }

// WithSite names the cluster of hosts this rank's host belongs to, in a
// job that spans clusters (joined by gateways, or by a network slower
// than each cluster's own), instead of MD_SITE. Collectives then go by
// sites too: within each host, among the hosts of each site, then among
// the sites. A host is in the site its first rank (in the communicator)
// names.
func WithSite(name string) Option { return func(c *config) { c.site = &name } }

// WithAppNum sets the number of the program this rank runs in a job of
// several programs, instead of MD_APPNUM (which mdrun sets for each
// program of `mdrun -n 2 a : -n 3 b`). It must not be negative.
func WithAppNum(n int) Option { return func(c *config) { c.appNum = &n } }

// Init joins the job: it finds the launcher (mdrun, or none for a world of
// one), loads the subdevices, exchanges business cards and connects routes.
// If it fails once the launcher knows the rank, it aborts the job with
// the error as the reason, so under a launcher that then ends the process
// (see World.Abort) it does not return.
func Init(ctx context.Context, opts ...Option) (*World, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.logger == nil {
		c.logger = hclog.New(&hclog.LoggerOptions{
			Name:   "multidevice",
			Level:  loglevel.FromEnv("MD_LOG_LEVEL", hclog.Warn, os.Stderr),
			Output: os.Stderr,
		})
	}
	if c.boot == nil {
		b, err := bootstrap.Open(ctx, c.logger.Named("bootstrap"))
		if err != nil {
			return nil, fmt.Errorf("adi: init: %w", err)
		}
		c.boot = b
	}
	w, err := initWorld(ctx, &c)
	if err != nil {
		reason := err.Error()
		_ = c.boot.Abort(1, reason)
		_ = c.boot.Close()
		return nil, err
	}
	return w, nil
}

func initWorld(ctx context.Context, c *config) (*World, error) {
	hostColl := true
	if c.hostColl != nil {
		hostColl = *c.hostColl
	} else if v := os.Getenv("MD_HOST_COLLECTIVES"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("adi: init: MD_HOST_COLLECTIVES=%q: want 0 or 1 (or false or true)", v)
		}
		hostColl = on
	}
	appNum, err := appNumber(c.appNum)
	if err != nil {
		return nil, err
	}
	plugins := c.plugins
	if plugins == nil {
		var err error
		if plugins, err = multidevice.LoadPlugins(pick(c.pluginsPath, os.Getenv("MD_PLUGINS"))); err != nil {
			return nil, fmt.Errorf("adi: init: %w", err)
		}
	}
	table := c.table
	if table == nil {
		if path := pick(c.tablePath, os.Getenv("MD_CONNTABLE")); path != "" {
			var err error
			if table, err = loadTable(path, c.boot.Host()); err != nil {
				return nil, fmt.Errorf("adi: init: %w", err)
			}
		}
	}
	fwd, err := multidevice.ForwardFromEnv(os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("adi: init: %w", err)
	}
	site := os.Getenv("MD_SITE")
	if c.site != nil {
		site = *c.site
	}
	dev, err := multidevice.Open(ctx, multidevice.Options{
		Site:      site,
		Forward:   fwd,
		Bootstrap: c.boot,
		Plugins:   plugins,
		Table:     table,
		Factories: c.factories,
		Logger:    c.logger,
		Relay:     c.relay,
	})
	if err != nil {
		return nil, fmt.Errorf("adi: init: %w", err)
	}
	w := &World{dev: dev, boot: c.boot, hostColl: hostColl, appNum: appNum}
	if c.relay {
		return w, nil // a relay has no rank in the world, hence no communicator
	}
	ranks := make([]int, dev.Size())
	for i := range ranks {
		ranks[i] = i
	}
	w.comm = newComm(w, worldContext, ranks)
	return w, nil
}

// appNumber is the program number WithAppNum or MD_APPNUM gives, 0 when
// neither does.
func appNumber(opt *int) (int, error) {
	if opt != nil {
		if *opt < 0 {
			return 0, fmt.Errorf("adi: init: WithAppNum(%d): want a number from 0", *opt)
		}
		return *opt, nil
	}
	v := os.Getenv("MD_APPNUM")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("adi: init: MD_APPNUM=%q: want a number from 0", v)
	}
	return n, nil
}

// loadTable reads a table file, or <dir>/<host>.json from a directory.
func loadTable(path, host string) (*conntable.Table, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, host+".json")
	}
	return conntable.Load(path)
}

func pick(first, second string) string {
	if first != "" {
		return first
	}
	return second
}

// Comm returns the world communicator.
func (w *World) Comm() *Comm { return w.comm }

// Finalize waits until every rank finalizes, then closes the subdevices and
// tells the launcher this rank is done. Requests still pending fail with
// ErrFinalized. It is idempotent.
func (w *World) Finalize(ctx context.Context) error {
	err := w.dev.Close(ctx)
	return errors.Join(err, w.bg.finish(ctx), w.boot.Close())
}

// Abort ends the whole job with code, telling the launcher why. Like
// MPI_Abort it may not return: the launcher ends this process with the
// others, and under PMIx the process exits with code itself once the
// launcher took the abort. A code outside 1..255, which an exit status
// cannot carry or would read as success, is taken as 1. An error means
// the launcher was not told.
func (w *World) Abort(code int, reason string) error { return w.boot.Abort(code, reason) }

// LinkStats counts what one subdevice carried from this rank to one peer.
type LinkStats = multidevice.LinkStats

// Stats lists the frames and bytes this rank sent, per peer (world rank) and
// subdevice.
func (w *World) Stats() []LinkStats { return w.dev.Stats() }

// Route names the subdevice that carries a message of n bytes from this rank
// to world rank peer.
func (w *World) Route(peer, n int) (string, error) { return w.dev.Route(peer, n) }

// Path describes how a message of n bytes travels to world rank peer: the
// subdevice of its first hop and the gateways it may pass through, by
// their ranks in the job (a dedicated relay's come after the world's);
// none for a direct link. After a failover it names the routes that carry
// traffic now.
func (w *World) Path(peer, n int) (subdevice string, gateways []int, err error) {
	return w.dev.Path(peer, n)
}

// ForwardStats describe this rank's part in indirect communication: what
// it holds and passed on as a gateway, and what it sent again.
type ForwardStats = multidevice.ForwardStats

// ForwardStats reports what this rank forwarded, holds and sent again.
func (w *World) ForwardStats() ForwardStats { return w.dev.ForwardStats() }

// Host is the launcher's name for this rank's host.
func (w *World) Host() string { return w.boot.Host() }

// Site is the name of the cluster of hosts this rank is in, as WithSite or
// MD_SITE gave it ("" when neither did).
func (w *World) Site() string { return w.dev.Site(w.dev.Rank()) }

// AppNum is the number, from 0, of the program this rank runs in a job of
// several programs (MPI's MPI_APPNUM): mdrun numbers the programs of
// `mdrun -n 2 ocean : -n 3 atmos` 0 and 1, in order, and their ranks are
// consecutive in the world. A job of one program is program 0. Coupled
// programs usually split the world by it and join the halves with
// Comm.IntercommCreate.
func (w *World) AppNum() int { return w.appNum }
