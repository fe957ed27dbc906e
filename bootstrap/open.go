package bootstrap

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// Environment variables mdrun sets for each rank; see the package doc.
const (
	EnvAddr   = "MDRUN_ADDR"
	EnvRank   = "MDRUN_RANK"
	EnvSize   = "MDRUN_SIZE"
	EnvJobID  = "MDRUN_JOBID"
	EnvSecret = "MDRUN_SECRET"
	// SecretFromStdin as the value of EnvSecret says that the secret is
	// the first line of standard input. mdrun passes it so to ranks on
	// other hosts: a remote-exec command line (ssh's) can be read by every
	// user of both hosts with ps, standard input cannot.
	SecretFromStdin = "-"
	EnvHost         = "MDRUN_HOST"
	// EnvExitWithService=1 makes a rank send itself SIGTERM when its
	// connection to the mdrun service ends, unless it called Close first
	// (not during or after an Abort): mdrun closes the service to end
	// ranks it started on other hosts.
	EnvExitWithService = "MDRUN_EXIT_WITH_SERVICE"
)

// lookupFunc reads the environment; os.LookupEnv in production, a map in
// tests.
type lookupFunc func(key string) (string, bool)

// backend is one way of learning about the job. Adding a launcher means
// adding one of these to [backends].
type backend struct {
	name string
	// detect reports whether the environment belongs to this backend.
	detect func(env lookupFunc) bool
	// open joins the job. A *refusedError says the backend tried and the
	// environment is not its own after all; Open then tries the next one.
	open func(ctx context.Context, logger hclog.Logger, st *openState) (Bootstrap, error)
}

// openState is what the backends of one Open share.
type openState struct {
	env lookupFunc
	// own: env is this process's environment (Open's), which a backend
	// that takes a one-use resource from it (PMI_FD) changes.
	own    bool
	stdin  io.Reader // where MDRUN_SECRET=- reads the secret
	pmi    *pmiConn  // the PMI manager's connection, once opened
	pmiErr error
}

// backends lists the launcher backends in the order Open tries them. When
// none matches, the process is a singleton. PMIx comes after PMI: Hydra
// sets PMI_FD and no PMIX_* variable, Open MPI's mpirun and Slurm's
// srun --mpi=pmix the reverse, so the order matters only to a process
// that has both (one launcher started under another); PMI_FD, an open
// descriptor, is then the surer sign, unless it is no stream socket (see
// staleFDError).
func backends() []backend {
	return []backend{
		{name: "mdrun", detect: detectMdrun, open: openMdrun},
		{name: "pmi2", detect: detectPMI, open: openPMI2},
		{name: "pmi1", detect: detectPMI, open: openPMI1},
		{name: "pmix", detect: detectPMIx, open: openPMIx},
	}
}

// Open returns this process's view of the job, picking the backend from the
// environment as the package doc describes. ctx bounds connecting to the
// launcher. A nil logger logs nothing.
//
// When the environment names a launcher but is broken (a malformed
// variable, an unreachable service, a refused secret), Open fails with an
// error naming the variable or address; it never falls back to a singleton.
func Open(ctx context.Context, logger hclog.Logger) (Bootstrap, error) {
	// A snapshot: a backend that takes PMI_FD out of the environment
	// must not make the next backend (PMI-1 after a refused PMI-2) see
	// another launcher.
	return openIn(ctx, logger, &openState{env: envSnapshot(os.Environ()), stdin: os.Stdin, own: true})
}

// envSnapshot turns "KEY=value" strings into a lookupFunc.
func envSnapshot(kv []string) lookupFunc {
	m := make(map[string]string, len(kv))
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// markRank hands this process's environment over from the launcher to the
// rank that joined through it, for the processes the rank starts: it sets
// parent (the variable that makes their Open fail as a rank's child) to
// value, then removes the variables in unset and every PMIx launch
// variable with remove. In that order: an Open that reads the environment
// meanwhile finds the one or the others, never neither (and becomes a
// singleton).
func markRank(parent, value string, unset []string, remove func(key string) error) error {
	if err := os.Setenv(parent, value); err != nil {
		return fmt.Errorf("setting %s: %w", parent, err)
	}
	for _, kv := range pmixLaunchVars(os.Environ()) {
		k, _, _ := strings.Cut(kv, "=")
		unset = append(unset, k)
	}
	for _, k := range unset {
		if err := remove(k); err != nil {
			return err
		}
	}
	return nil
}

// open is Open in an environment of the caller's, which it leaves alone.
func open(ctx context.Context, logger hclog.Logger, env lookupFunc, stdin io.Reader) (Bootstrap, error) {
	return openIn(ctx, logger, &openState{env: env, stdin: stdin})
}

func openIn(ctx context.Context, logger hclog.Logger, st *openState) (Bootstrap, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	env := st.env
	var refusals []string
	for _, b := range backends() {
		if !b.detect(env) {
			continue
		}
		bs, err := b.open(ctx, logger.Named(b.name), st)
		var ref *refusedError
		if errors.As(err, &ref) {
			logger.Debug("backend refused the environment", "backend", b.name, "reason", ref.reason)
			refusals = append(refusals, b.name+": "+ref.reason)
			continue
		}
		if err != nil {
			if st.pmi != nil {
				st.pmi.close()
			}
			return nil, err
		}
		logger.Debug("bootstrap opened", "backend", b.name, "rank", bs.Rank(), "size", bs.Size())
		return bs, nil
	}
	if len(refusals) > 0 {
		// A launcher is there but no backend speaks its language: a
		// singleton would only hang the job.
		if st.pmi != nil {
			st.pmi.close()
		}
		return nil, fmt.Errorf("bootstrap: no backend accepted the launcher: %s", strings.Join(refusals, "; "))
	}
	logger.Debug("no launcher in the environment, running as a singleton")
	return newSingleton()
}

// mdrunEnv is the parsed MDRUN_* environment of one rank.
type mdrunEnv struct {
	addr   string
	rank   int
	size   int
	jobID  string
	secret []byte
	host   string
	// secretOnStdin: MDRUN_SECRET is SecretFromStdin, the secret came on
	// standard input.
	secretOnStdin bool
	// exitWithService: end the process when the service goes away.
	exitWithService bool
}

func detectMdrun(env lookupFunc) bool {
	for _, k := range []string{EnvAddr, EnvRank, EnvSize, EnvJobID, EnvSecret, EnvHost} {
		if _, ok := env(k); ok {
			return true
		}
	}
	return false
}

// parseMdrunEnv reads and checks every MDRUN_* variable. Errors name the
// variable, because the user has to find which one is wrong.
func parseMdrunEnv(env lookupFunc, stdin io.Reader) (mdrunEnv, error) {
	var e mdrunEnv
	str := func(k string) (string, error) {
		v, ok := env(k)
		if !ok || v == "" {
			return "", fmt.Errorf("bootstrap: %s is not set but other MDRUN_* variables are; was this process started by mdrun?", k)
		}
		return v, nil
	}
	num := func(k string) (int, error) {
		s, err := str(k)
		if err != nil {
			return 0, err
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return 0, fmt.Errorf("bootstrap: %s=%q is not a number", k, s)
		}
		return n, nil
	}
	var err error
	if e.addr, err = str(EnvAddr); err != nil {
		return e, err
	}
	if e.size, err = num(EnvSize); err != nil {
		return e, err
	}
	if e.size < 1 {
		return e, fmt.Errorf("bootstrap: %s=%d, want at least 1", EnvSize, e.size)
	}
	if e.rank, err = num(EnvRank); err != nil {
		return e, err
	}
	if e.rank < 0 || e.rank >= e.size {
		return e, fmt.Errorf("bootstrap: %s=%d is not in [0, %s=%d)", EnvRank, e.rank, EnvSize, e.size)
	}
	if e.jobID, err = str(EnvJobID); err != nil {
		return e, err
	}
	s, err := str(EnvSecret)
	if err != nil {
		return e, err
	}
	if e.secretOnStdin = s == SecretFromStdin; e.secretOnStdin {
		if s, err = readSecret(stdin); err != nil {
			return e, fmt.Errorf("bootstrap: %s=%s: reading the secret from standard input: %w", EnvSecret, SecretFromStdin, err)
		}
	}
	if e.secret, err = hex.DecodeString(s); err != nil {
		return e, fmt.Errorf("bootstrap: %s is not hexadecimal: %w", EnvSecret, err)
	}
	if e.host, err = str(EnvHost); err != nil {
		return e, err
	}
	if v, ok := env(EnvExitWithService); ok {
		if v != "0" && v != "1" {
			return e, fmt.Errorf("bootstrap: %s=%q, want 0 or 1", EnvExitWithService, v)
		}
		e.exitWithService = v == "1"
	}
	return e, nil
}

// formatEnv is the inverse of parseMdrunEnv, as "KEY=value" strings for
// os/exec.
func formatEnv(e mdrunEnv) []string {
	secret := hex.EncodeToString(e.secret)
	if e.secretOnStdin {
		secret = SecretFromStdin
	}
	env := []string{
		EnvAddr + "=" + e.addr,
		EnvRank + "=" + strconv.Itoa(e.rank),
		EnvSize + "=" + strconv.Itoa(e.size),
		EnvJobID + "=" + e.jobID,
		EnvSecret + "=" + secret,
		EnvHost + "=" + e.host,
	}
	if e.exitWithService {
		env = append(env, EnvExitWithService+"=1")
	}
	return env
}

// maxSecretLine bounds the line readSecret accepts: a secret is 32 bytes,
// 64 hexadecimal digits.
const maxSecretLine = 1024

// readSecret reads the secret's line from r, one byte at a time, so that
// nothing after the line is taken from the application's standard input.
func readSecret(r io.Reader) (string, error) {
	if r == nil {
		return "", errors.New("no standard input")
	}
	var line []byte
	var b [1]byte
	for len(line) <= maxSecretLine {
		n, err := r.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				break
			}
			line = append(line, b[0])
			continue
		}
		if errors.Is(err, io.EOF) {
			if len(line) == 0 {
				return "", errors.New("it is empty")
			}
			break
		}
		if err != nil {
			return "", err
		}
	}
	if len(line) > maxSecretLine {
		return "", fmt.Errorf("the first line is longer than %d bytes", maxSecretLine)
	}
	s := strings.TrimSuffix(string(line), "\r")
	if s == "" {
		return "", errors.New("the first line is empty")
	}
	return s, nil
}
