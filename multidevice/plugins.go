package multidevice

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"regexp"

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
	// PluginDir is where external subdevice binaries are looked up.
	PluginDir  string
	SubDevices []SubDeviceSpec
}

// SubDeviceSpec is one subdevice block.
type SubDeviceSpec struct {
	Name     string
	Enabled  bool
	Command  string   // external binary; empty for a built-in subdevice
	Args     []string // arguments for Command
	Checksum string   // "sha256:<hex>" of Command, checked before it starts
	Config   []byte   // the config block as JSON; nil when absent
	// Where is the block's position, "file:line,col", for error messages.
	Where string
}

type pluginsFile struct {
	PluginDir  string         `hcl:"plugin_dir,optional"`
	SubDevices []subdeviceHCL `hcl:"subdevice,block"`
}

type subdeviceHCL struct {
	Name     string     `hcl:"name,label"`
	Enabled  *bool      `hcl:"enabled,optional"`
	Command  string     `hcl:"command,optional"`
	Args     []string   `hcl:"args,optional"`
	Checksum string     `hcl:"checksum,optional"`
	Config   *configHCL `hcl:"config,block"`
	DefRange hcl.Range  `hcl:",def_range"`
}

type configHCL struct {
	Body hcl.Body `hcl:",remain"`
}

var checksumRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ParsePlugins decodes plugins.hcl source. filename is used in diagnostics,
// which carry file, line and column.
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
	seen := make(map[string]string)
	for _, s := range raw.SubDevices {
		where := s.DefRange.String()
		if prev, dup := seen[s.Name]; dup {
			return nil, fmt.Errorf("multidevice: plugins: %s: subdevice %q is already defined at %s; merge the two blocks", where, s.Name, prev)
		}
		seen[s.Name] = where
		if s.Checksum != "" && !checksumRE.MatchString(s.Checksum) {
			return nil, fmt.Errorf("multidevice: plugins: %s: checksum %q: want \"sha256:\" and 64 lower-case hex digits", where, s.Checksum)
		}
		if s.Command == "" && (len(s.Args) > 0 || s.Checksum != "") {
			return nil, fmt.Errorf("multidevice: plugins: %s: args and checksum need a command (they describe an external plugin)", where)
		}
		spec := SubDeviceSpec{
			Name:     s.Name,
			Enabled:  s.Enabled == nil || *s.Enabled,
			Command:  s.Command,
			Args:     s.Args,
			Checksum: s.Checksum,
			Where:    where,
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
