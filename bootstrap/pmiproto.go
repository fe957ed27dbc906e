package bootstrap

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// pmiConn is the connection to the process manager that PMI_FD names. Its
// reads belong to one goroutine at a time (the handshake, then the job's
// worker); writes are serialised, so Abort can write while the worker
// waits for a reply.
type pmiConn struct {
	desc string // "PMI_FD=6", for messages
	// inherited is the number PMI_FD named, -1 once closed; rw is a
	// duplicate of it.
	inherited int
	rw        net.Conn
	r         *bufio.Reader
	wmu       sync.Mutex
}

// connError is a failure of the connection itself (end of file, a message
// that does not parse, a reply out of step): the job cannot go on.
type connError struct{ err error }

func (e *connError) Error() string { return e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

// rcError is a request the manager answered with a non-zero return code;
// the connection stays in step.
type rcError struct {
	cmd string
	rc  int
	msg string
}

func (e *rcError) Error() string {
	if e.msg != "" {
		return fmt.Sprintf("the process manager refused %s: rc=%d msg=%s", e.cmd, e.rc, e.msg)
	}
	return fmt.Sprintf("the process manager refused %s: rc=%d", e.cmd, e.rc)
}

// staleFDError is a PMI_FD that cannot be a manager's connection: a
// closed number, or one open on something other than one end of a stream
// socketpair (a pipe or a file cannot carry PMI's two-way conversation,
// and a network connection or one through a named socket is some other
// program's). It is a stale
// number, inherited from a PMI rank through a parent that was not a
// multidevice program (which would have replaced PMI_FD, see
// EnvPMIParent), and closed or reused since.
type staleFDError struct {
	desc, what string
}

func (e *staleFDError) Error() string {
	return fmt.Sprintf("bootstrap: pmi: %s is %s: it is not a process manager's connection but a number inherited from a PMI rank through another program; unset %s to run this process as a singleton", e.desc, e.what, EnvPMIFD)
}

// openPMIConn wraps the inherited descriptor named by PMI_FD, which must
// be one end of a stream socketpair: Hydra and Slurm hand out nothing
// else. The number may belong to somebody else (staleFDError, or a
// socketpair of the program's own that does not answer as a manager), so
// the connection is made from a duplicate (an *os.File closes its
// descriptor when it is collected), and the number itself is closed only
// once a handshake succeeded (closeInherited).
func openPMIConn(env lookupFunc) (*pmiConn, error) {
	s, _ := env(EnvPMIFD)
	desc := EnvPMIFD + "=" + s
	fd, err := strconv.Atoi(s)
	if err != nil || fd < 0 {
		return nil, fmt.Errorf("bootstrap: pmi: %s is not a file descriptor", desc)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		if errors.Is(err, syscall.EBADF) {
			return nil, &staleFDError{desc, "not an open file descriptor"}
		}
		return nil, fmt.Errorf("bootstrap: pmi: %s: %w", desc, err)
	}
	if mode := uint32(st.Mode); mode&syscall.S_IFMT != syscall.S_IFSOCK {
		return nil, &staleFDError{desc, fileKind(mode) + ", not a socket"}
	}
	if what := notSocketpairEnd(fd); what != "" {
		return nil, &staleFDError{desc, what}
	}
	dup, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if errno != 0 {
		return nil, fmt.Errorf("bootstrap: pmi: %s: duplicate: %w", desc, errno)
	}
	f := os.NewFile(dup, "PMI_FD")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: pmi: %s: %w", desc, err)
	}
	c := &pmiConn{desc: desc, inherited: fd, rw: nc}
	c.r = bufio.NewReaderSize(c.rw, 4096)
	return c, nil
}

// notSocketpairEnd says what keeps the socket fd from being one end of a
// socketpair, the only thing a manager hands out as PMI_FD (Hydra and
// Slurm call socketpair(AF_UNIX, SOCK_STREAM)), or "" if nothing does. A
// network socket, a listening one, and a connection to or from a named
// Unix socket (a PMIx client's to its server, say) are somebody else's:
// the handshake would go into their stream and the reply read out of it.
func notSocketpairEnd(fd int) string {
	if typ, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TYPE); err != nil || typ != syscall.SOCK_STREAM {
		return "a socket but not a stream socket"
	}
	local, err := syscall.Getsockname(fd)
	if err != nil {
		return fmt.Sprintf("a socket whose address cannot be read (%v)", err)
	}
	lu, ok := local.(*syscall.SockaddrUnix)
	if !ok {
		return "a network socket, not one end of a socketpair"
	}
	peer, err := syscall.Getpeername(fd)
	if err != nil {
		return fmt.Sprintf("an unconnected Unix socket (%v), not one end of a socketpair", err)
	}
	pu, _ := peer.(*syscall.SockaddrUnix)
	// Unnamed ends read back as "@" (the syscall package's spelling of a
	// leading NUL), or "".
	unnamed := func(name string) bool { return name == "" || name == "@" }
	switch {
	case !unnamed(lu.Name):
		return fmt.Sprintf("a connection accepted on the Unix socket %q, not one end of a socketpair", lu.Name)
	case pu == nil || !unnamed(pu.Name):
		name := "?"
		if pu != nil {
			name = pu.Name
		}
		return fmt.Sprintf("a connection to the Unix socket %q, not one end of a socketpair", name)
	}
	return ""
}

// fileKind names the type of file in a stat mode, for messages.
func fileKind(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case 0:
		// The Go runtime's own eventfd, in a Go program, has the number
		// Hydra gives its first rank.
		return "an anonymous inode (an eventfd, epoll or timer descriptor)"
	case syscall.S_IFIFO:
		return "a pipe"
	case syscall.S_IFREG:
		return "a regular file"
	case syscall.S_IFCHR:
		return "a character device"
	case syscall.S_IFDIR:
		return "a directory"
	case syscall.S_IFBLK:
		return "a block device"
	}
	return fmt.Sprintf("a file of type %#o", mode&syscall.S_IFMT)
}

func (c *pmiConn) write(s string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := io.WriteString(c.rw, s); err != nil {
		return &connError{fmt.Errorf("send to the process manager: %w", err)}
	}
	return nil
}

// readErr describes a failed read; the end of the stream means the manager
// is gone.
func readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &connError{fmt.Errorf("the process manager closed the connection (%v)", err)}
	}
	if errors.Is(err, errBadPMI) {
		return &connError{err}
	}
	return &connError{fmt.Errorf("read from the process manager: %w", err)}
}

// during runs fn, a blocking exchange of the handshake, so that ctx ending
// interrupts it.
func (c *pmiConn) during(ctx context.Context, fn func() error) error {
	if d, ok := ctx.Deadline(); ok {
		c.rw.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { c.rw.SetDeadline(time.Unix(1, 0)) })
	err := fn()
	stop()
	c.rw.SetDeadline(time.Time{})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

func (c *pmiConn) close() error { return c.rw.Close() }

// closeInherited closes the number PMI_FD named, once a handshake showed
// it was the manager's connection: this process's children must not
// inherit it (it is not close-on-exec). Until then it may be somebody
// else's.
func (c *pmiConn) closeInherited() {
	if c.inherited >= 0 {
		syscall.Close(c.inherited)
		c.inherited = -1
	}
}

// initPMI sends the init line both versions start with and returns the
// manager's answer.
func (c *pmiConn) initPMI(version, subversion int) (*pmiMsg, error) {
	if err := c.write(formatPMI1("init", "pmi_version", strconv.Itoa(version), "pmi_subversion", strconv.Itoa(subversion))); err != nil {
		return nil, err
	}
	m, err := readPMI1(c.r)
	if err != nil {
		return nil, readErr(err)
	}
	if m.cmd != "response_to_init" {
		return nil, &connError{fmt.Errorf("%w: init answered with %q", errBadPMI, m.cmd)}
	}
	return m, nil
}

// pmiProto is one PMI version's requests. Only the job's worker goroutine
// calls them, except abort, which may run beside it.
type pmiProto interface {
	put(key, value string) error
	fence() error
	// get reports found=false when the manager has no such key.
	get(key string) (value string, found bool, err error)
	abort(code int, msg string) error
	finalize() error
}

// checkReply turns a reply into an error when it is not want or its rc is
// not zero.
func checkReply(m *pmiMsg, want string) error {
	if m.cmd != want {
		return &connError{fmt.Errorf("%w: want %s, got %q", errBadPMI, want, m.cmd)}
	}
	rc, err := m.rc()
	if err != nil {
		return &connError{err}
	}
	if rc != 0 {
		msg, _ := m.get("msg")
		if msg == "" {
			msg, _ = m.get("errmsg")
		}
		return &rcError{cmd: want, rc: rc, msg: msg}
	}
	return nil
}

// pmi1 speaks PMI-1 (MPICH's simple PMI wire protocol).
type pmi1 struct {
	c       *pmiConn
	kvsname string
}

func (p *pmi1) roundTrip(req, want string) (*pmiMsg, error) {
	if err := p.c.write(req); err != nil {
		return nil, err
	}
	m, err := readPMI1(p.c.r)
	if err != nil {
		return nil, readErr(err)
	}
	return m, checkReply(m, want)
}

func (p *pmi1) put(key, value string) error {
	_, err := p.roundTrip(formatPMI1("put", "kvsname", p.kvsname, "key", key, "value", value), "put_result")
	return err
}

func (p *pmi1) fence() error {
	_, err := p.roundTrip(formatPMI1("barrier_in"), "barrier_out")
	return err
}

func (p *pmi1) get(key string) (string, bool, error) {
	m, err := p.roundTrip(formatPMI1("get", "kvsname", p.kvsname, "key", key), "get_result")
	var rc *rcError
	if errors.As(err, &rc) {
		// PMI-1 says "not found" only through a non-zero rc and a
		// free-text message.
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	v, ok := m.get("value")
	if !ok {
		return "", false, &connError{fmt.Errorf("%w: get_result without a value", errBadPMI)}
	}
	return v, true, nil
}

func (p *pmi1) abort(code int, _ string) error {
	// PMI-1 carries no reason the managers print; the job's logger
	// reported it before.
	return p.c.write(formatPMI1("abort", "exitcode", strconv.Itoa(code)))
}

func (p *pmi1) finalize() error {
	_, err := p.roundTrip(formatPMI1("finalize"), "finalize_ack")
	return err
}

// pmi2 speaks PMI-2.
type pmi2 struct {
	c *pmiConn
}

func (p *pmi2) roundTrip(want, cmd string, kv ...string) (*pmiMsg, error) {
	if err := p.c.write(formatPMI2(cmd, kv...)); err != nil {
		return nil, err
	}
	m, err := readPMI2(p.c.r)
	if err != nil {
		return nil, readErr(err)
	}
	return m, checkReply(m, want)
}

func (p *pmi2) put(key, value string) error {
	_, err := p.roundTrip("kvs-put-response", "kvs-put", "key", key, "value", value)
	return err
}

// barrierKey is a key no rank puts. After kvs-fence, asking for it is the
// barrier.
const barrierKey = "md.barrier"

// fence is kvs-fence and then a kvs-get of a key nobody put. PMI-2 does not
// say that kvs-fence waits for the other ranks, and Hydra's does not: it
// answers at once and holds back kvs-gets until every rank has fenced. A
// get of a missing key is answered only then, so the pair is a barrier
// under Hydra and costs one round trip under a manager whose fence already
// is one (Slurm). Its answer is "not found", in whichever wording (see
// get).
func (p *pmi2) fence() error {
	if _, err := p.roundTrip("kvs-fence-response", "kvs-fence"); err != nil {
		return err
	}
	_, _, err := p.get(barrierKey)
	return err
}

// found reads a PMI-2 reply's found=TRUE|FALSE and value.
func found(m *pmiMsg) (string, bool, error) {
	switch f, _ := m.get("found"); f {
	case "TRUE":
		v, ok := m.get("value")
		if !ok {
			return "", false, &connError{fmt.Errorf("%w: %s found without a value", errBadPMI, m.cmd)}
		}
		return v, true, nil
	case "FALSE":
		return "", false, nil
	default:
		return "", false, &connError{fmt.Errorf("%w: %s: found=%.10q", errBadPMI, m.cmd, f)}
	}
}

func (p *pmi2) get(key string) (string, bool, error) {
	m, err := p.roundTrip("kvs-get-response", "kvs-get", "srcid", "-1", "key", key)
	if missingKey(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return found(m)
}

// missingKey reports whether err is a manager's answer that a kvs-get's
// key is not there. Slurm says found=FALSE; current Hydra answers rc=1
// with errmsg=key_not_found instead (MPICH's own barrier, a get of a key
// nobody puts, ignores that error the same way). Any other refusal is
// the manager failing, which a Fence or Get must not read as "no value".
func missingKey(err error) bool {
	var rc *rcError
	return errors.As(err, &rc) && rc.rc == 1 && (rc.msg == "" || rc.msg == "key_not_found")
}

// jobAttr asks for a job attribute such as PMI_process_mapping.
func (p *pmi2) jobAttr(key string) (string, bool, error) {
	m, err := p.roundTrip("info-getjobattr-response", "info-getjobattr", "key", key)
	if err != nil {
		return "", false, err
	}
	return found(m)
}

// noAbortReason is the message of an abort given no reason: MPICH's
// PMI-2 parser rejects a request with an empty value.
const noAbortReason = "no reason given"

func (p *pmi2) abort(code int, msg string) error {
	if msg == "" {
		msg = noAbortReason
	}
	// Slurm ends the job only for isworld=TRUE, and leaves the other
	// ranks waiting otherwise; Hydra takes the job's status from exitcode
	// (1 without it) and prints message. msg is MPICH's older spelling.
	return p.c.write(formatPMI2("abort", "isworld", "TRUE", "exitcode", strconv.Itoa(code), "message", msg, "msg", msg))
}

func (p *pmi2) finalize() error {
	_, err := p.roundTrip("finalize-response", "finalize")
	return err
}
