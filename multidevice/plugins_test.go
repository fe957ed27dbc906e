package multidevice

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/bootstrap"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/sditest"
)

func TestParsePlugins(t *testing.T) {
	cfg, err := ParsePlugins([]byte(`
plugin_dir = "/opt/md"
subdevice "shm" {
  config {
    ring_bytes = 4096
  }
}
subdevice "tcp" { enabled = false }
subdevice "fab" {
  command  = "sdi-fab"
  args     = ["-v"]
  checksum = "sha256:`+strings.Repeat("ab", 32)+`"
}
subdevice "tcp2" { builtin = "tcp" }
`), "p.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PluginDir != "/opt/md" || len(cfg.SubDevices) != 4 {
		t.Fatalf("%+v", cfg)
	}
	for i, want := range []string{"shm", "tcp", "sdi-fab", "tcp"} {
		if s := cfg.SubDevices[i]; !s.External() && s.BuiltinName() != want {
			t.Errorf("%s runs built-in %q, want %q", s.Name, s.BuiltinName(), want)
		}
	}
	if s := cfg.SubDevices[0]; s.Name != "shm" || !s.Enabled || string(s.Config) != `{"ring_bytes":4096}` {
		t.Errorf("shm: %+v config %s", s, s.Config)
	}
	if cfg.SubDevices[1].Enabled {
		t.Error("tcp should be disabled")
	}
	if s := cfg.SubDevices[2]; s.Command != "sdi-fab" || len(s.Args) != 1 {
		t.Errorf("fab: %+v", s)
	}
	if _, err := LoadPlugins(""); err != nil {
		t.Fatalf("embedded default: %v", err)
	}
}

func TestParsePluginsErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"syntax", `subdevice "shm" {`, "p.hcl:1"},
		{"duplicate", "subdevice \"a\" {}\nsubdevice \"a\" {}", "p.hcl:2,1-14: subdevice \"a\" is already defined at p.hcl:1"},
		{"unknown attribute", "subdevice \"a\" {\n  colour = 1\n}", "p.hcl:2"},
		{"unknown top-level", "speed = 3\nsubdevice \"a\" {}", `p.hcl:1,1-6: Unsupported argument; An argument named "speed" is not expected here`},
		{"bad checksum", "subdevice \"a\" {\n command = \"x\"\n checksum = \"md5:1\"\n}", "want \"sha256:\""},
		{"args without command", `subdevice "a" { args = ["x"] }`, "need a command"},
		{"builtin and command", "subdevice \"a\" {\n builtin = \"tcp\"\n command = \"sdi-tcp\"\n}", `p.hcl:1,1-14: builtin "tcp" and command "sdi-tcp" exclude each other`},
		{"empty", ``, "no subdevice blocks"},
		{"self", `subdevice "self" { builtin = "shm" }`, `p.hcl:1,1-17: the name "self" is the device's own path`},
		{"no name", `subdevice "" {}`, "p.hcl:1,1-13: a subdevice needs a name"},
		{"config not literal", "subdevice \"a\" {\n  config {\n    x = var.y\n  }\n}", "p.hcl:3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePlugins([]byte(tc.src), "p.hcl")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func FuzzParsePlugins(f *testing.F) {
	f.Add([]byte(DefaultPlugins))
	f.Add([]byte("subdevice \"a\" {\n  config {\n    x = [1, \"two\", {k = true}]\n  }\n}"))
	f.Add([]byte(`plugin_dir = "x"` + "\n" + `subdevice "b" { command = "c" }`))
	f.Fuzz(func(t *testing.T, src []byte) {
		cfg, err := ParsePlugins(src, "fuzz.hcl")
		if err == nil && len(cfg.SubDevices) == 0 {
			t.Fatal("accepted a file without subdevices")
		}
	})
}

// TestParsePluginsExternal covers what external blocks add: where commands
// are found, the timeout, the data plane choice, and their errors.
func TestParsePluginsExternal(t *testing.T) {
	sum := "sha256:" + strings.Repeat("0f", 32)
	wd, err := os.Getwd() // a relative file's directory
	if err == nil {
		wd, err = filepath.EvalSymlinks(wd) // as the kernel finds it
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, file, src string
		want            SubDeviceSpec // Name, Path, Timeout, SharedMemory, Checksum checked
		wantErr         string
	}{
		{name: "bare name in the file's directory", file: "/etc/md/plugins.hcl",
			src:  `subdevice "a" { command = "sdi-a" }`,
			want: SubDeviceSpec{Name: "a", Path: "/etc/md/sdi-a", SharedMemory: true}},
		{name: "bare name in a relative plugin_dir", file: "/etc/md/plugins.hcl",
			src:  "plugin_dir = \"bin\"\nsubdevice \"a\" { command = \"sdi-a\" }",
			want: SubDeviceSpec{Name: "a", Path: "/etc/md/bin/sdi-a", SharedMemory: true}},
		{name: "bare name in an absolute plugin_dir", file: "/etc/md/plugins.hcl",
			src:  "plugin_dir = \"/opt/p\"\nsubdevice \"a\" { command = \"sdi-a\" }",
			want: SubDeviceSpec{Name: "a", Path: "/opt/p/sdi-a", SharedMemory: true}},
		{name: "relative path from the file", file: "/etc/md/plugins.hcl",
			src:  "plugin_dir = \"/opt/p\"\nsubdevice \"a\" { command = \"../x/sdi-a\" }",
			want: SubDeviceSpec{Name: "a", Path: "/etc/x/sdi-a", SharedMemory: true}},
		{name: "absolute path", file: "/etc/md/plugins.hcl",
			src:  `subdevice "a" { command = "/usr/lib/sdi-a" }`,
			want: SubDeviceSpec{Name: "a", Path: "/usr/lib/sdi-a", SharedMemory: true}},
		{name: "every key", file: "p.hcl",
			src:  "subdevice \"a\" {\n command = \"sdi-a\"\n checksum = \"" + sum + "\"\n timeout = \"1m30s\"\n shared_memory = false\n}",
			want: SubDeviceSpec{Name: "a", Path: filepath.Join(wd, "sdi-a"), Timeout: 90 * time.Second, Checksum: sum}},
		{name: "bad timeout", file: "p.hcl", src: "subdevice \"a\" {\n command = \"x\"\n timeout = \"soon\"\n}",
			wantErr: `p.hcl:1,1-14: timeout "soon": want a positive duration`},
		{name: "negative timeout", file: "p.hcl", src: "subdevice \"a\" {\n command = \"x\"\n timeout = \"-1s\"\n}",
			wantErr: "positive duration"},
		{name: "timeout without command", file: "p.hcl", src: `subdevice "a" { timeout = "1s" }`,
			wantErr: "need a command"},
		{name: "shared_memory without command", file: "p.hcl", src: `subdevice "a" { shared_memory = false }`,
			wantErr: "need a command"},
		{name: "shared_memory not a bool", file: "p.hcl", src: "subdevice \"a\" {\n command = \"x\"\n shared_memory = \"no\"\n}",
			wantErr: "p.hcl:3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParsePlugins([]byte(tc.src), tc.file)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := cfg.SubDevices[0]
			if s.Name != tc.want.Name || s.Path != tc.want.Path || s.Timeout != tc.want.Timeout ||
				s.SharedMemory != tc.want.SharedMemory || s.Checksum != tc.want.Checksum || !s.External() {
				t.Fatalf("got %+v, want %+v", s, tc.want)
			}
			if tc.want.Checksum != "" && len(s.ChecksumBytes()) != 32 {
				t.Fatalf("ChecksumBytes = %x", s.ChecksumBytes())
			}
		})
	}
}

// TestPluginsRelativeFile: with a relative plugins.hcl (MD_PLUGINS=plugins.hcl,
// the common case) commands still resolve to absolute paths from the file's
// directory, as docs/plugins.hcl.md promises. A bare command once resolved
// to "sdi-mine", which exec looks up in $PATH instead.
func TestPluginsRelativeFile(t *testing.T) {
	for _, tc := range []struct {
		name, file, src, binary string // binary: where the command is, from the test's directory
	}{
		{"bare name", "plugins.hcl", `subdevice "mine" { command = "sdi-mine" }`, "sdi-mine"},
		{"bare name, file in a subdirectory", "etc/plugins.hcl", `subdevice "mine" { command = "sdi-mine" }`, "etc/sdi-mine"},
		{"relative plugin_dir", "plugins.hcl", "plugin_dir = \"bin\"\nsubdevice \"mine\" { command = \"sdi-mine\" }", "bin/sdi-mine"},
		{"dot-slash path", "./plugins.hcl", `subdevice "mine" { command = "./sdi-mine" }`, "sdi-mine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(t.TempDir())
			for _, f := range []struct {
				path, body string
				mode       os.FileMode
			}{{tc.file, tc.src, 0o644}, {tc.binary, "#!/bin/sh\n", 0o755}} {
				if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(f.path, []byte(f.body), f.mode); err != nil {
					t.Fatal(err)
				}
			}
			cfg, err := LoadPlugins(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			p := cfg.SubDevices[0].Path
			want, err := os.Stat(tc.binary)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := os.Stat(p); !filepath.IsAbs(p) || err != nil || !os.SameFile(got, want) {
				t.Fatalf("command resolved to %q (stat: %v), want the absolute path of %s next to the file", p, err, tc.binary)
			}
		})
	}
}

// TestConfigErrorNamesPluginsFile: a subdevice that refuses its config
// block fails Open with the plugins.hcl file and line of the block, as
// docs/plugins.hcl.md promises for every error; the error named only the
// subdevice.
func TestConfigErrorNamesPluginsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plugins.hcl")
	if err := os.WriteFile(path, []byte("subdevice \"picky\" {\n  config {\n    ring_bytes = 1000\n  }\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	plugins, err := LoadPlugins(path)
	if err != nil {
		t.Fatal(err)
	}
	boots, err := bootstrap.InProcess(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	fab := sditest.NewFabric(sditest.LoopbackOptions{Name: "picky"})
	picky := func(log hclog.Logger) sdi.SubDevice { return refusingSub{fab.New(log)} }
	d, err := Open(context.Background(), Options{Bootstrap: boots[0], Plugins: plugins, Factories: map[string]sdi.Factory{"picky": picky}, Logger: testLogger(t)})
	if err == nil {
		d.Close(context.Background())
		t.Fatal("Open with a refused config succeeded")
	}
	if !strings.Contains(err.Error(), path+":1") || !strings.Contains(err.Error(), "ring_bytes 1000 must be a power of two") {
		t.Fatalf("Open = %v; want the plugins.hcl file and line, and the subdevice's reason", err)
	}
}

// refusingSub refuses any config at Open.
type refusingSub struct{ sdi.SubDevice }

func (refusingSub) Open(context.Context, sdi.OpenParams) (sdi.Local, error) {
	return sdi.Local{}, errors.New("picky: config: ring_bytes 1000 must be a power of two")
}

// TestPluginsRelativeThroughSymlink: with the working directory reached
// through a symlink ($PWD logical, as a shell sets it) and
// MD_PLUGINS=../plugins.hcl, the kernel reads the physical parent's
// file; a bare command must be found next to that file, not next to the
// logical parent, where filepath.Abs put it.
func TestPluginsRelativeThroughSymlink(t *testing.T) {
	root := t.TempDir()
	phys := filepath.Join(root, "phys")
	work := filepath.Join(phys, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(phys, "plugins.hcl"), []byte("subdevice \"x\" {\n  command = \"sdi-x\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(phys, "sdi-x"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(work, link); err != nil {
		t.Fatal(err)
	}
	t.Chdir(link)
	t.Setenv("PWD", link)
	cfg, err := LoadPlugins("../plugins.hcl")
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.SubDevices[0].Path
	want, err := os.Stat(filepath.Join(phys, "sdi-x"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(got); err != nil || !os.SameFile(fi, want) {
		t.Fatalf("command resolved to %s (%v); the plugins.hcl read is %s, its sdi-x %s", got, err, filepath.Join(phys, "plugins.hcl"), filepath.Join(phys, "sdi-x"))
	}
}
