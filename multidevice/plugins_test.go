package multidevice

import (
	"strings"
	"testing"
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
`), "p.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PluginDir != "/opt/md" || len(cfg.SubDevices) != 3 {
		t.Fatalf("%+v", cfg)
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
		{"empty", ``, "no subdevice blocks"},
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
