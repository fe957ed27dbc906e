package conntable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Version is the file-format version this package reads and writes.
const Version = 1

// Peer selectors with a special meaning; see the package documentation.
const (
	SelectLocal  = "@local"
	SelectRemote = "@remote"
	SelectAll    = "*"
	rankPrefix   = "rank:"
	// AllClasses keys the routes that apply to every class an entry does not
	// name.
	AllClasses = "*"
)

// ErrInvalid is wrapped by every error about a table's content.
var ErrInvalid = errors.New("conntable: invalid table")

// Class is a message-size class: messages of at most MaxBytes bytes. The last
// class of a table has MaxBytes 0, meaning unbounded.
type Class struct {
	Name     string `json:"name"`
	MaxBytes int64  `json:"max_bytes,omitempty"`
}

// Route is one way to reach a peer.
type Route struct {
	SubDevice string  `json:"subdevice"`
	Via       string  `json:"via,omitempty"`  // next hop: a host name or "rank:N"; empty for a direct link
	Cost      float64 `json:"cost,omitempty"` // informational
	// Standby, in an entry with failover, keeps the route idle while a
	// route of its list that is not on standby lives: a slow network that
	// only takes over, instead of taking its share all along.
	Standby bool `json:"standby,omitempty"`
}

// Entry gives the routes to the peers a selector names.
type Entry struct {
	To     string             `json:"to"`
	Routes map[string][]Route `json:"routes"`
	// Failover makes every route of a list carry traffic and stand in for
	// the others: each message is kept until the peer acknowledges it and
	// goes again over another route if its own fails, and traffic spreads
	// over the live routes. Without it a direct route is used alone and
	// the later ones only where it cannot connect.
	Failover bool `json:"failover,omitempty"`
}

// Table is a connection table as stored in a file. It is a plain value and not
// safe for concurrent mutation.
type Table struct {
	Version int     `json:"version"`
	Host    string  `json:"host,omitempty"`
	Classes []Class `json:"classes,omitempty"`
	Peers   []Entry `json:"peers"`
}

// DefaultClasses is the single class used when a table names none.
var DefaultClasses = []Class{{Name: "all"}}

// classes returns the table's classes or the default.
func (t *Table) classes() []Class {
	if len(t.Classes) == 0 {
		return DefaultClasses
	}
	return t.Classes
}

// Validate checks the table's structure. Errors wrap ErrInvalid and name the
// offending field ("peers[2].routes.large[0].subdevice").
func (t *Table) Validate() error {
	if t.Version != Version {
		return fmt.Errorf("%w: version is %d, this build reads version %d", ErrInvalid, t.Version, Version)
	}
	classes := t.classes()
	names := make(map[string]bool, len(classes))
	var prev int64
	for i, c := range classes {
		switch {
		case c.Name == "" || c.Name == AllClasses:
			return fmt.Errorf("%w: classes[%d]: name %q is empty or reserved", ErrInvalid, i, c.Name)
		case names[c.Name]:
			return fmt.Errorf("%w: classes[%d]: duplicate class name %q", ErrInvalid, i, c.Name)
		case i == len(classes)-1 && c.MaxBytes != 0:
			return fmt.Errorf("%w: classes[%d] (%s): the last class must be unbounded; drop max_bytes", ErrInvalid, i, c.Name)
		case i < len(classes)-1 && c.MaxBytes <= prev:
			return fmt.Errorf("%w: classes[%d] (%s): max_bytes %d must be greater than the previous class's %d", ErrInvalid, i, c.Name, c.MaxBytes, prev)
		}
		names[c.Name] = true
		prev = c.MaxBytes
	}
	seen := make(map[string]int, len(t.Peers))
	for i, e := range t.Peers {
		where := fmt.Sprintf("peers[%d]", i)
		if err := checkSelector(e.To); err != nil {
			return fmt.Errorf("%w: %s.to: %v", ErrInvalid, where, err)
		}
		if j, dup := seen[e.To]; dup {
			return fmt.Errorf("%w: %s.to: %q already has an entry at peers[%d]", ErrInvalid, where, e.To, j)
		}
		seen[e.To] = i
		if len(e.Routes) == 0 {
			return fmt.Errorf("%w: %s (%s): no routes", ErrInvalid, where, e.To)
		}
		for cls, routes := range e.Routes {
			if cls != AllClasses && !names[cls] {
				return fmt.Errorf("%w: %s.routes: unknown class %q (classes: %s)", ErrInvalid, where, cls, classNames(classes))
			}
			if len(routes) == 0 {
				return fmt.Errorf("%w: %s.routes.%s: empty route list", ErrInvalid, where, cls)
			}
			for k, r := range routes {
				if r.SubDevice == "" {
					return fmt.Errorf("%w: %s.routes.%s[%d]: subdevice is empty", ErrInvalid, where, cls, k)
				}
				if r.Via != "" {
					if err := checkHop(r.Via); err != nil {
						return fmt.Errorf("%w: %s.routes.%s[%d].via: %v", ErrInvalid, where, cls, k, err)
					}
				}
				if math.IsNaN(r.Cost) || math.IsInf(r.Cost, 0) || r.Cost < 0 {
					return fmt.Errorf("%w: %s.routes.%s[%d].cost: %v is not a finite non-negative number", ErrInvalid, where, cls, k, r.Cost)
				}
				if r.Standby && !e.Failover {
					return fmt.Errorf("%w: %s.routes.%s[%d].standby: a route stands by only in an entry with \"failover\": true", ErrInvalid, where, cls, k)
				}
			}
			if !slices.ContainsFunc(routes, func(r Route) bool { return !r.Standby }) {
				return fmt.Errorf("%w: %s.routes.%s: every route is on standby; leave at least one to carry the traffic", ErrInvalid, where, cls)
			}
		}
		if _, ok := e.Routes[AllClasses]; !ok {
			for _, c := range classes {
				if _, ok := e.Routes[c.Name]; !ok {
					return fmt.Errorf("%w: %s (%s): no routes for class %q; add it or a \"*\" entry", ErrInvalid, where, e.To, c.Name)
				}
			}
		}
	}
	return nil
}

func classNames(cs []Class) string {
	n := make([]string, len(cs))
	for i, c := range cs {
		n[i] = c.Name
	}
	return strings.Join(n, ", ")
}

func checkSelector(s string) error {
	switch s {
	case SelectLocal, SelectRemote, SelectAll:
		return nil
	}
	return checkHop(s)
}

// checkHop accepts "rank:N" or a host name.
func checkHop(s string) error {
	if n, ok := strings.CutPrefix(s, rankPrefix); ok {
		// Written as Resolve looks it up (strconv.Itoa): "rank:05"
		// or "rank:+5" would cover no rank, and pass the duplicate
		// check beside "rank:5".
		r, err := strconv.ParseInt(n, 10, 32)
		if err != nil || r < 0 || strconv.FormatInt(r, 10) != n {
			return fmt.Errorf("%q: want rank:N with N a non-negative integer in decimal, without sign or leading zeros", s)
		}
		return nil
	}
	if s == "" || strings.ContainsAny(s, " \t\n@*") {
		return fmt.Errorf("%q is not a host name, rank:N, @local, @remote or *", s)
	}
	return nil
}

// Parse decodes and validates a table. Syntax errors carry the line and
// column; unknown fields are refused so that typos do not pass silently.
func Parse(data []byte) (*Table, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var t Table
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, describeJSONError(data, err))
	}
	// Token, not More: More is false before a stray '}' or ']'.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %s: trailing data after the table", ErrInvalid, position(data, dec.InputOffset()))
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &t, nil
}

func describeJSONError(data []byte, err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("%s: %v", position(data, max(se.Offset-1, 0)), se) // Offset is just past the bad byte
	case errors.As(err, &te):
		return fmt.Sprintf("%s: field %q: %v", position(data, te.Offset), te.Field, te)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of input"
	}
	return err.Error()
}

// position turns a byte offset into "line L, column C".
func position(data []byte, off int64) string {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	line, col := 1, 1
	for _, b := range data[:off] {
		if b == '\n' {
			line++
			col = 1
		} else {
			col++
		}
	}
	return fmt.Sprintf("line %d, column %d", line, col)
}

// Load reads and parses a table file; errors name the file.
func Load(path string) (*Table, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("conntable: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Encode returns the table as indented JSON, entries in a stable order.
func (t *Table) Encode() ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("conntable: encode: %w", err)
	}
	return append(out, '\n'), nil
}

// Save writes the table to path atomically (a temporary file renamed into
// place), so a reader never sees half a table.
func (t *Table) Save(path string) error {
	data, err := t.Encode()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".conntable-*")
	if err != nil {
		return fmt.Errorf("conntable: save %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("conntable: save %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("conntable: save %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("conntable: save %s: %w", path, err)
	}
	return nil
}

// Candidate describes a loaded subdevice to Derive.
type Candidate struct {
	Name        string
	HostOnly    bool   // reaches only ranks on the same host (shm)
	Exclusivity uint32 // higher is preferred
}

// Derive builds the table a job uses when none is given: ranks on the same
// host use the most exclusive candidate, ranks on other hosts the most
// exclusive candidate that is not host-only. Further candidates follow as
// alternatives. Ties break by name so every rank derives the same table.
func Derive(cands []Candidate) (*Table, error) {
	sorted := append([]Candidate(nil), cands...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].Exclusivity != sorted[j].Exclusivity {
			return sorted[i].Exclusivity > sorted[j].Exclusivity
		}
		return sorted[i].Name < sorted[j].Name
	})
	var local, remote []Route
	for _, c := range sorted {
		local = append(local, Route{SubDevice: c.Name})
		if !c.HostOnly {
			remote = append(remote, Route{SubDevice: c.Name})
		}
	}
	if len(local) == 0 {
		return nil, fmt.Errorf("%w: no subdevices to derive routes from", ErrInvalid)
	}
	t := &Table{Version: Version, Peers: []Entry{{To: SelectLocal, Routes: map[string][]Route{AllClasses: local}}}}
	if len(remote) > 0 {
		t.Peers = append(t.Peers, Entry{To: SelectRemote, Routes: map[string][]Route{AllClasses: remote}})
	}
	return t, nil
}
