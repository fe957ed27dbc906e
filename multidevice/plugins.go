package multidevice

import (
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// DefaultPlugins is the plugins.hcl used when none is given: the built-in
// shm and tcp subdevices with their defaults.
//
//go:embed default_plugins.hcl
var DefaultPlugins []byte

// PluginsConfig is a decoded plugins.hcl: which subdevices to load and how.
type PluginsConfig struct {
	// PluginDir is where external subdevice binaries are looked up, as
	// written; relative to the file's directory when relative.
	PluginDir  string
	SubDevices []SubDeviceSpec
}

// SubDeviceSpec is one subdevice block.
type SubDeviceSpec struct {
	Name    string
	Enabled bool
	// Builtin is the built-in subdevice the block runs under Name, so that
	// one can run twice (tcp on two networks); empty means Name itself.
	Builtin  string
	Command  string   // external binary as written; empty for a built-in subdevice
	Path     string   // Command resolved: see ParsePlugins
	Args     []string // arguments for Command
	Checksum string   // "sha256:<hex>" of Command, checked before it starts
	Config   []byte   // the config block as JSON; nil when absent
	// Timeout bounds the plugin's start and each control call; 0 means
	// the default of sdi/plugin.
	Timeout time.Duration
	// SharedMemory is false when the block asks for the gRPC stream data
	// plane instead of shared-memory rings.
	SharedMemory bool
	// Where is the block's position, "file:line,col", for error messages.
	Where string
}

// BuiltinName is the built-in subdevice a block without a command runs.
func (s *SubDeviceSpec) BuiltinName() string {
	if s.Builtin != "" {
		return s.Builtin
	}
	return s.Name
}

// External reports whether the subdevice runs as a plugin binary.
func (s *SubDeviceSpec) External() bool { return s.Command != "" }

// ChecksumBytes returns the SHA-256 from Checksum, or nil when none is set.
func (s *SubDeviceSpec) ChecksumBytes() []byte {
	b, err := hex.DecodeString(strings.TrimPrefix(s.Checksum, "sha256:"))
	if s.Checksum == "" || err != nil {
		return nil
	}
	return b
}

type pluginsFile struct {
	PluginDir  string         `hcl:"plugin_dir,optional"`
	SubDevices []subdeviceHCL `hcl:"subdevice,block"`
}

type subdeviceHCL struct {
	Name         string     `hcl:"name,label"`
	Enabled      *bool      `hcl:"enabled,optional"`
	Builtin      string     `hcl:"builtin,optional"`
	Command      string     `hcl:"command,optional"`
	Args         []string   `hcl:"args,optional"`
	Checksum     string     `hcl:"checksum,optional"`
	Timeout      string     `hcl:"timeout,optional"`
	SharedMemory *bool      `hcl:"shared_memory,optional"`
	Config       *configHCL `hcl:"config,block"`
	DefRange     hcl.Range  `hcl:",def_range"`
}

type configHCL struct {
	Body hcl.Body `hcl:",remain"`
}

var checksumRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// pluginsBase returns the directory of the plugins file filename as an
// absolute path, found as the kernel found the file: from the physical
// working directory, not $PWD, and through symlinks, so that a ".." after
// one leads where it led open(2). filepath.Abs cleans ".." as text from
// $PWD: with the working directory reached through a symlink,
// "../plugins.hcl" was read from one directory and its commands looked
// for in another.
func pluginsBase(filename string) (string, error) {
	dir := filepath.Dir(filename)
	if !filepath.IsAbs(dir) {
		wd, err := syscall.Getwd()
		if err != nil {
			return "", err
		}
		dir = wd + string(filepath.Separator) + dir
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		return real, nil
	}
	// A file not on disk (ParsePlugins of bytes): nothing to follow.
	return filepath.Clean(dir), nil
}

// ParsePlugins decodes plugins.hcl source. filename is used in diagnostics,
// which carry file, line and column, and to resolve paths: a relative
// plugin_dir is taken from the file's directory, a command without a slash
// is looked up in plugin_dir (by default the file's directory), and a
// relative command with a slash is taken from the file's directory. The
// resolved paths are absolute; a relative filename is taken from the
// working directory.
func ParsePlugins(src []byte, filename string) (*PluginsConfig, error) {
	f, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("multidevice: plugins: %w", diags)
	}
	var raw pluginsFile
	if diags := gohcl.DecodeBody(f.Body, nil, &raw); diags.HasErrors() {
		return nil, fmt.Errorf("multidevice: plugins: %w", diags)
	}
	cfg := &PluginsConfig{PluginDir: raw.PluginDir}
	// Relative to an absolute directory: exec looks a bare "sdi-x" up in
	// $PATH, not next to the file. Only a relative command needs base, so
	// a working directory that is gone fails only a file that has one.
	base, baseErr := pluginsBase(filename)
	dir := raw.PluginDir
	if dir == "" {
		dir = base
	} else if !filepath.IsAbs(dir) {
		dir = filepath.Join(base, dir)
	}
	seen := make(map[string]string)
	for _, s := range raw.SubDevices {
		where := s.DefRange.String()
		if prev, dup := seen[s.Name]; dup {
			return nil, fmt.Errorf("multidevice: plugins: %s: subdevice %q is already defined at %s; merge the two blocks", where, s.Name, prev)
		}
		seen[s.Name] = where
		switch s.Name {
		case "":
			return nil, fmt.Errorf("multidevice: plugins: %s: a subdevice needs a name", where)
		case selfName:
			return nil, fmt.Errorf("multidevice: plugins: %s: the name %q is the device's own path to its rank; name the subdevice otherwise", where, s.Name)
		}
		if s.Checksum != "" && !checksumRE.MatchString(s.Checksum) {
			return nil, fmt.Errorf("multidevice: plugins: %s: checksum %q: want \"sha256:\" and 64 lower-case hex digits", where, s.Checksum)
		}
		if s.Builtin != "" && s.Command != "" {
			return nil, fmt.Errorf("multidevice: plugins: %s: builtin %q and command %q exclude each other: a subdevice is built in or a plugin", where, s.Builtin, s.Command)
		}
		if s.Command == "" && (len(s.Args) > 0 || s.Checksum != "" || s.Timeout != "" || s.SharedMemory != nil) {
			return nil, fmt.Errorf("multidevice: plugins: %s: args, checksum, timeout and shared_memory need a command (they describe an external plugin)", where)
		}
		spec := SubDeviceSpec{
			Name:         s.Name,
			Enabled:      s.Enabled == nil || *s.Enabled,
			Builtin:      s.Builtin,
			Command:      s.Command,
			Args:         s.Args,
			Checksum:     s.Checksum,
			SharedMemory: s.SharedMemory == nil || *s.SharedMemory,
			Where:        where,
		}
		switch {
		case s.Command == "":
		case strings.ContainsRune(s.Command, 0):
			return nil, fmt.Errorf("multidevice: plugins: %s: command contains a NUL byte", where)
		case filepath.IsAbs(s.Command):
			spec.Path = filepath.Clean(s.Command)
		case strings.ContainsRune(s.Command, '/'):
			spec.Path = filepath.Join(base, s.Command)
		default:
			spec.Path = filepath.Join(dir, s.Command)
		}
		if spec.Path != "" && !filepath.IsAbs(spec.Path) {
			return nil, fmt.Errorf("multidevice: plugins: %s: command %q: resolving it from the directory of %s: %w", where, s.Command, filename, baseErr)
		}
		if s.Timeout != "" {
			d, err := time.ParseDuration(s.Timeout)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("multidevice: plugins: %s: timeout %q: want a positive duration such as \"30s\"", where, s.Timeout)
			}
			spec.Timeout = d
		}
		if s.Config != nil {
			js, err := bodyJSON(s.Config.Body)
			if err != nil {
				return nil, fmt.Errorf("multidevice: plugins: %s: config: %w", where, err)
			}
			spec.Config = js
		}
		cfg.SubDevices = append(cfg.SubDevices, spec)
	}
	if len(cfg.SubDevices) == 0 {
		return nil, fmt.Errorf("multidevice: plugins: %s: no subdevice blocks; add e.g. subdevice \"tcp\" {}", filename)
	}
	return cfg, nil
}

// bodyJSON evaluates a config block's attributes (literals only) and returns
// them as a JSON object, the form subdevices receive in OpenParams.Config.
func bodyJSON(body hcl.Body) ([]byte, error) {
	attrs, diags := body.JustAttributes()
	if diags.HasErrors() {
		return nil, diags
	}
	vals := make(map[string]cty.Value, len(attrs))
	for name, a := range attrs {
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() {
			return nil, diags
		}
		vals[name] = v
	}
	obj := cty.ObjectVal(vals)
	js, err := ctyjson.Marshal(obj, obj.Type())
	if err != nil {
		return nil, err
	}
	if !json.Valid(js) {
		return nil, fmt.Errorf("config does not encode as JSON")
	}
	return js, nil
}

// LoadPlugins reads a plugins.hcl file; an empty path yields DefaultPlugins.
func LoadPlugins(path string) (*PluginsConfig, error) {
	if path == "" {
		return ParsePlugins(DefaultPlugins, "default plugins.hcl")
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("multidevice: plugins: %w", err)
	}
	return ParsePlugins(src, path)
}
