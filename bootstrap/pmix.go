package bootstrap

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

// Environment variables a PMIx server (Open MPI's mpirun and prterun,
// Slurm's srun --mpi=pmix) gives the processes it starts. The client
// library reads them in PMIx_Init; this package only looks for them.
const (
	EnvPMIxNamespace = "PMIX_NAMESPACE" // the job's namespace
	EnvPMIxRank      = "PMIX_RANK"      // this process's rank in it
)

// EnvPMIxParent is set by the pmix backend in a rank's own environment
// once PMIx_Init has succeeded, to "<namespace>.<rank>", in place of the
// launcher's variables that let a process connect as that rank (see
// [pmixLaunchVars]): a child process the rank starts inherits the
// environment, and a PMIx server would take its PMIx_Init for a second
// copy of the rank. A child's Open that finds it, and no launcher of its
// own, fails saying so, as a rank's child does under mdrun and PMI.
// Removing it from a child's environment makes the child a singleton.
const EnvPMIxParent = "MD_PMIX_PARENT"

// pmixServerURIs are the server's address, one variable per protocol
// generation; a server sets those its clients may speak (Open MPI 4.1.4
// sets PMIX_SERVER_URI2, 21, 3, 4 and 41).
var pmixServerURIs = []string{
	"PMIX_SERVER_URI", "PMIX_SERVER_URI2", "PMIX_SERVER_URI21",
	"PMIX_SERVER_URI3", "PMIX_SERVER_URI4", "PMIX_SERVER_URI41",
}

// pmixMark returns the first PMIx variable set, as "KEY=value", for
// messages; ok is false when none is.
func pmixMark(env lookupFunc) (mark string, ok bool) {
	for _, k := range append([]string{EnvPMIxRank, EnvPMIxNamespace}, pmixServerURIs...) {
		if v, ok := env(k); ok {
			return k + "=" + v, true
		}
	}
	return "", false
}

// detectPMIx reports whether a PMIx server started this process, or a
// rank of a PMIx job did ([EnvPMIxParent]). Any of the server's variables
// is enough: one half set is a broken launch to report, not a singleton
// to become.
func detectPMIx(env lookupFunc) bool {
	_, ok := pmixMark(env)
	_, child := env(EnvPMIxParent)
	return ok || child
}

// pmixLaunchDesc names the launch for messages: this rank's PMIX_RANK
// and the server's address in the newest protocol generation set, as
// "KEY=value, KEY=value".
func pmixLaunchDesc(env lookupFunc) string {
	find := func(k string) (string, bool) {
		if v, ok := env(k); ok {
			return k + "=" + v, true
		}
		return "", false
	}
	var desc []string
	if kv, ok := find(EnvPMIxRank); ok {
		desc = append(desc, kv)
	}
	for i := len(pmixServerURIs) - 1; i >= 0; i-- {
		if kv, ok := find(pmixServerURIs[i]); ok {
			desc = append(desc, kv)
			break
		}
	}
	if len(desc) == 0 {
		mark, _ := pmixMark(env)
		return mark
	}
	return strings.Join(desc, ", ")
}

// pmixChildErr is the error of an Open in a process that a rank of a
// PMIx job started ([EnvPMIxParent] set) and no launcher did; nil
// otherwise. A process that has both was started by a launcher the rank
// ran, and joins that launcher's job.
func pmixChildErr(env lookupFunc) error {
	parent, ok := env(EnvPMIxParent)
	if !ok {
		return nil
	}
	if _, launched := pmixMark(env); launched {
		return nil
	}
	return fmt.Errorf("bootstrap: pmix: %s=%s: this process was started by that rank of a PMIx job, not by the launcher, "+
		"and a PMIx server admits each rank once; start it with a launcher of its own, or without %s to run it as a singleton",
		EnvPMIxParent, parent, EnvPMIxParent)
}

// pmixLaunchVars returns the entries of environ ("KEY=value") that let a
// process connect to the PMIx server as this rank: the server's address
// in any protocol generation (PMIX_SERVER_URI, URI2 ... URI41 and newer)
// and the rank's identity (PMIX_NAMESPACE, PMIX_RANK, PMIX_ID). Without
// them PMIx_Init has no server to join; the launcher's other PMIX_*
// variables (store paths, security and buffer modes, PMIX_MCA_*
// parameters) are settings, not an identity, and stay.
func pmixLaunchVars(environ []string) []string {
	var vars []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == EnvPMIxNamespace, k == EnvPMIxRank, k == "PMIX_ID", strings.HasPrefix(k, "PMIX_SERVER_URI"):
			vars = append(vars, kv)
		}
	}
	return vars
}

// errPMIxNotBuilt is what Open says under a PMIx launcher in a binary built
// without the pmix backend: a singleton there would be one of N copies of
// rank 0.
func errPMIxNotBuilt(env lookupFunc) error {
	mark, _ := pmixMark(env)
	return fmt.Errorf("bootstrap: pmix: started by a PMIx launcher (%s), but this binary was built without -tags pmix "+
		"(or without cgo): rebuild with `go build -tags pmix` (needs libpmix-dev), or launch with mdrun or a PMI-2 launcher", mark)
}

// pmixKeyMax is PMIX_MAX_KEYLEN: the longest key PMIx stores.
const pmixKeyMax = 511

// pmixKey is the PMIx key under which a Put of key is stored. PMIx keys
// are C strings and those starting with "pmix" are reserved, so every key
// gets a prefix: "md." before a key of printable ASCII, which stays
// readable in the server's debug output, and "md64." before the base64url
// of any other (a NUL byte would end the C string). The two prefixes
// differ at their third byte, so no two keys share a PMIx key. A key of
// maxKey bytes encodes to at most 5+344 bytes, within pmixKeyMax.
func pmixKey(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "md64." + base64.RawURLEncoding.EncodeToString([]byte(key))
		}
	}
	return "md." + key
}

// pmixHost names this rank's host as the PMI backends do,
// "<hostname>#<node>", with the PMIx server's node id: ranks on one node
// share shared memory, and nodes that share a host name (network
// namespaces, containers) stay apart. Without a node id (hasNode false),
// it is the host name alone.
func pmixHost(hostname string, node uint32, hasNode bool) string {
	if !hasNode {
		return hostname
	}
	return hostname + "#" + strconv.FormatUint(uint64(node), 10)
}

// pmixStatus names the PMIx status codes a client call returns, as
// pmix_common.h spells them; PMIx_Error_string gives only a short text
// ("NOT-FOUND").
var pmixStatus = map[int]string{
	0: "PMIX_SUCCESS", -1: "PMIX_ERROR",
	-11: "PMIX_ERR_EXISTS", -12: "PMIX_ERR_INVALID_CRED", -15: "PMIX_ERR_WOULD_BLOCK",
	-16: "PMIX_ERR_UNKNOWN_DATA_TYPE", -18: "PMIX_ERR_TYPE_MISMATCH", -20: "PMIX_ERR_UNPACK_FAILURE",
	-21: "PMIX_ERR_PACK_FAILURE", -23: "PMIX_ERR_NO_PERMISSIONS", -24: "PMIX_ERR_TIMEOUT",
	-25: "PMIX_ERR_UNREACH", -27: "PMIX_ERR_BAD_PARAM", -28: "PMIX_ERR_RESOURCE_BUSY",
	-29: "PMIX_ERR_OUT_OF_RESOURCE", -31: "PMIX_ERR_INIT", -32: "PMIX_ERR_NOMEM",
	-46: "PMIX_ERR_NOT_FOUND", -47: "PMIX_ERR_NOT_SUPPORTED", -49: "PMIX_ERR_COMM_FAILURE",
	-52: "PMIX_ERR_PARTIAL_SUCCESS", -53: "PMIX_ERR_DUPLICATE_KEY", -59: "PMIX_ERR_PARAM_VALUE_NOT_SUPPORTED",
	-60: "PMIX_ERR_EMPTY", -61: "PMIX_ERR_LOST_CONNECTION", -62: "PMIX_ERR_EXISTS_OUTSIDE_SCOPE",
	-156: "PMIX_OPERATION_IN_PROGRESS", -157: "PMIX_OPERATION_SUCCEEDED", -158: "PMIX_ERR_INVALID_OPERATION",
}

// Status codes this package acts on.
const (
	pmixErrNotFound       = -46
	pmixErrUnreach        = -25
	pmixErrCommFailure    = -49
	pmixErrLostConnection = -61
)

// pmixError is a PMIx call that failed. It matches [ErrNotFound] for
// PMIX_ERR_NOT_FOUND and [ErrClosed] when the server is gone.
type pmixError struct {
	call   string // "PMIx_Fence"
	status int
	text   string // PMIx_Error_string's, "" if not known
}

func (e *pmixError) Error() string {
	name, ok := pmixStatus[e.status]
	if !ok {
		name = "PMIx status " + strconv.Itoa(e.status)
	}
	msg := "bootstrap: pmix: " + e.call + ": " + name
	if e.text != "" && !strings.EqualFold(e.text, name) {
		msg += ": " + e.text
	}
	return msg
}

func (e *pmixError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.status == pmixErrNotFound
	case ErrClosed:
		return e.status == pmixErrUnreach || e.status == pmixErrCommFailure || e.status == pmixErrLostConnection
	}
	return false
}
