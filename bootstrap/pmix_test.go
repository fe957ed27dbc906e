package bootstrap

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// openMPIEnv is what Open MPI 4.1.4's mpirun gives rank 1 of a job (the
// PMIx part, from `mpirun.openmpi -n 2 env`).
var openMPIEnv = []string{
	"PMIX_NAMESPACE=389349377", "PMIX_RANK=1", "PMIX_ID=389349377.1",
	"PMIX_SERVER_URI2=389349376.0;tcp4://127.0.0.1:56795", "PMIX_SERVER_URI21=389349376.0;tcp4://127.0.0.1:56795",
	"PMIX_SERVER_URI3=389349376.0;tcp4://127.0.0.1:56795", "PMIX_SERVER_URI4=389349376.0;tcp4://127.0.0.1:56795",
	"PMIX_SERVER_URI41=389349376.0;tcp4://127.0.0.1:56795", "PMIX_VERSION=4.2.2rc2",
	"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2",
}

func TestDetectPMIx(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string // pmixMark's answer, "" for none
	}{
		{"open mpi", openMPIEnv, "PMIX_RANK=1"},
		{"namespace alone", []string{"PMIX_NAMESPACE=slurm.pmix.7.0"}, "PMIX_NAMESPACE=slurm.pmix.7.0"},
		{"server address alone", []string{"PMIX_SERVER_URI41=x"}, "PMIX_SERVER_URI41=x"},
		{"pmix 2 server", []string{"PMIX_SERVER_URI=x"}, "PMIX_SERVER_URI=x"},
		// Hydra's ranks: PMI_FD, PMI_RANK, PMI_SIZE and nothing of PMIx.
		{"hydra", []string{"PMI_FD=6", "PMI_RANK=0", "PMI_SIZE=1"}, ""},
		{"other pmix variables", []string{"PMIX_VERSION=4.2.2", "PMIX_ID=1.0", "PMIX_HOSTNAME=vm"}, ""},
		// A rank's child: the rank took the launcher's variables out.
		{"rank's child", []string{EnvPMIxParent + "=389349377.0", "PMIX_VERSION=4.2.2"}, "child"},
		{"nothing", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := envSnapshot(tt.env)
			mark, ok := pmixMark(env)
			if tt.want != "child" && (mark != tt.want || ok != (tt.want != "")) {
				t.Errorf("pmixMark = %q, %v; want %q", mark, ok, tt.want)
			}
			if got := detectPMIx(env); got != (tt.want != "") {
				t.Errorf("detectPMIx = %v", got)
			}
		})
	}
}

// TestPMIOverPMIx: a process that has both PMI_FD and PMIx variables (a
// launcher started under another) speaks PMI; one with MDRUN_* speaks to
// mdrun.
func TestPMIOverPMIx(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Run("pmi", func(t *testing.T) {
		f := newFakePMI(t, 1, nil)
		bs, err := open(ctx, testLogger(t), envSnapshot(append(f.env(0), openMPIEnv...)), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer bs.Close()
		if _, ok := bs.(*pmiJob); !ok {
			t.Errorf("opened a %T, want the PMI backend's", bs)
		}
	})
	t.Run("mdrun", func(t *testing.T) {
		srv := startServer(t, 1, nil)
		bs, err := open(ctx, testLogger(t), envSnapshot(append(srv.Env(0), openMPIEnv...)), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer bs.Close()
		if _, ok := bs.(*client); !ok {
			t.Errorf("opened a %T, want mdrun's client", bs)
		}
	})
}

func TestPMIxKey(t *testing.T) {
	tests := []struct{ key, want string }{
		{"card", "md.card"},
		{"bootstrap.secret", "md.bootstrap.secret"},
		{"pmix.nodeid", "md.pmix.nodeid"}, // PMIx's reserved prefix is not a prefix here
		{"64.x", "md.64.x"},
		{"a b", "md64.YSBi"},
		{"nul\x00", "md64.bnVsAA"},
		{"é", "md64.w6k"},
		{strings.Repeat("k", maxKey), "md." + strings.Repeat("k", maxKey)},
	}
	for _, tt := range tests {
		if got := pmixKey(tt.key); got != tt.want {
			t.Errorf("pmixKey(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
	if n := len(pmixKey(strings.Repeat("\x00", maxKey))); n > pmixKeyMax {
		t.Errorf("the longest key encodes to %d bytes, over PMIx's %d", n, pmixKeyMax)
	}
}

// FuzzPMIxKey: keys map to distinct PMIx keys that a C string and PMIx's
// key length hold, outside PMIx's reserved "pmix" prefix.
func FuzzPMIxKey(f *testing.F) {
	for _, s := range [][2]string{{"card", "md.card"}, {"a b", "64.YSBi"}, {"\x00", ""}, {"é", "md64.w6k"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if a == "" || len(a) > maxKey || b == "" || len(b) > maxKey {
			return
		}
		ka, kb := pmixKey(a), pmixKey(b)
		if (ka == kb) != (a == b) {
			t.Fatalf("pmixKey(%q) = %q, pmixKey(%q) = %q", a, ka, b, kb)
		}
		if len(ka) > pmixKeyMax || strings.ContainsRune(ka, 0) || !utf8.ValidString(ka) || strings.HasPrefix(ka, "pmix") {
			t.Fatalf("pmixKey(%q) = %q is not a PMIx key", a, ka)
		}
	})
}

func TestPMIxHost(t *testing.T) {
	tests := []struct {
		node    uint32
		hasNode bool
		want    string
	}{
		{0, true, "vm#0"},
		{7, true, "vm#7"},
		{0, false, "vm"},
	}
	for _, tt := range tests {
		if got := pmixHost("vm", tt.node, tt.hasNode); got != tt.want {
			t.Errorf("pmixHost(vm, %d, %v) = %q, want %q", tt.node, tt.hasNode, got, tt.want)
		}
	}
}

func TestPMIxError(t *testing.T) {
	tests := []struct {
		err      *pmixError
		msg      string
		notFound bool
		closed   bool
	}{
		{&pmixError{"PMIx_Get", -46, "NOT-FOUND"}, "bootstrap: pmix: PMIx_Get: PMIX_ERR_NOT_FOUND: NOT-FOUND", true, false},
		{&pmixError{"PMIx_Fence", -61, "LOST_CONNECTION"}, "bootstrap: pmix: PMIx_Fence: PMIX_ERR_LOST_CONNECTION: LOST_CONNECTION", false, true},
		{&pmixError{"PMIx_Fence", -25, "UNREACHABLE"}, "bootstrap: pmix: PMIx_Fence: PMIX_ERR_UNREACH: UNREACHABLE", false, true},
		{&pmixError{"PMIx_Init", -31, ""}, "bootstrap: pmix: PMIx_Init: PMIX_ERR_INIT", false, false},
		{&pmixError{"PMIx_Put", -9999, "ODD"}, "bootstrap: pmix: PMIx_Put: PMIx status -9999: ODD", false, false},
		{&pmixError{"PMIx_Put", -1, "ERROR"}, "bootstrap: pmix: PMIx_Put: PMIX_ERROR: ERROR", false, false},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.msg {
			t.Errorf("Error() = %q, want %q", got, tt.msg)
		}
		if got := errors.Is(tt.err, ErrNotFound); got != tt.notFound {
			t.Errorf("%v: errors.Is ErrNotFound = %v", tt.err, got)
		}
		if got := errors.Is(tt.err, ErrClosed); got != tt.closed {
			t.Errorf("%v: errors.Is ErrClosed = %v", tt.err, got)
		}
	}
}

// TestPMIxLaunchVars: the variables a rank takes out of its environment
// after PMIx_Init are those that let a process join as the rank, in every
// protocol generation, and no others.
func TestPMIxLaunchVars(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    []string
	}{
		{"open mpi", append(openMPIEnv, "PMIX_SECURITY_MODE=native", "PMIX_MCA_gds=hash", "PMIX_SERVER_TMPDIR=/tmp/x", "PATH=/bin"), []string{
			"PMIX_NAMESPACE=389349377", "PMIX_RANK=1", "PMIX_ID=389349377.1",
			"PMIX_SERVER_URI2=389349376.0;tcp4://127.0.0.1:56795", "PMIX_SERVER_URI21=389349376.0;tcp4://127.0.0.1:56795",
			"PMIX_SERVER_URI3=389349376.0;tcp4://127.0.0.1:56795", "PMIX_SERVER_URI4=389349376.0;tcp4://127.0.0.1:56795",
			"PMIX_SERVER_URI41=389349376.0;tcp4://127.0.0.1:56795",
		}},
		{"newer and older generations", []string{"PMIX_SERVER_URI=a", "PMIX_SERVER_URI51=b", "PMIX_SERVER_URI61=c"}, []string{"PMIX_SERVER_URI=a", "PMIX_SERVER_URI51=b", "PMIX_SERVER_URI61=c"}},
		{"names that only look alike", []string{"PMIX_RANKS=1", "XPMIX_RANK=1", "PMIX_NAMESPACE_X=1", "MD_PMIX_PARENT=1.0"}, nil},
		{"nothing", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pmixLaunchVars(tt.environ); !slices.Equal(got, tt.want) {
				t.Errorf("pmixLaunchVars = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestPMIxChildErr: a process a PMIx rank started fails to Open, naming
// the rank and how to run it as a singleton, unless a launcher of its own
// started it.
func TestPMIxChildErr(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string // "" for no error
	}{
		{"rank's child", []string{EnvPMIxParent + "=389349377.0"}, "bootstrap: pmix: MD_PMIX_PARENT=389349377.0: this process was started by that rank of a PMIx job, not by the launcher"},
		{"under a launcher of its own", append([]string{EnvPMIxParent + "=389349377.0"}, openMPIEnv...), ""},
		{"a rank", openMPIEnv, ""},
		{"nothing", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := pmixChildErr(envSnapshot(tt.env))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("pmixChildErr = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "without MD_PMIX_PARENT to run it as a singleton")):
				t.Errorf("pmixChildErr = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestPMIxLaunchDesc(t *testing.T) {
	uri := "PMIX_SERVER_URI41=389349376.0;tcp4://127.0.0.1:56795"
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"environment", openMPIEnv, "PMIX_RANK=1, " + uri},
		{"oldest generation", []string{"PMIX_SERVER_URI=x"}, "PMIX_SERVER_URI=x"},
		{"namespace alone", []string{"PMIX_NAMESPACE=n"}, "PMIX_NAMESPACE=n"},
	}
	for _, tt := range tests {
		if got := pmixLaunchDesc(envSnapshot(tt.env)); got != tt.want {
			t.Errorf("%s: pmixLaunchDesc = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// FuzzPMIxLaunchVars: what a rank takes out of its environment is a part
// of it, and only variables that identify the rank or its server.
func FuzzPMIxLaunchVars(f *testing.F) {
	f.Add("PMIX_RANK=1\x00PMIX_SERVER_URI41=a;b\x00PATH=/bin")
	f.Add("PMIX_SERVER_URIX\x00=\x00PMIX_ID")
	f.Fuzz(func(t *testing.T, s string) {
		environ := strings.Split(s, "\x00")
		for _, kv := range pmixLaunchVars(environ) {
			if !slices.Contains(environ, kv) {
				t.Fatalf("%q is not in the environment", kv)
			}
			k, _, _ := strings.Cut(kv, "=")
			if k != EnvPMIxRank && k != EnvPMIxNamespace && k != "PMIX_ID" && !strings.HasPrefix(k, "PMIX_SERVER_URI") {
				t.Fatalf("took %q", kv)
			}
		}
	})
}
