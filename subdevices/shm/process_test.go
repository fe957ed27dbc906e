package shm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// helperEnv makes the test binary act as rank 1 of TestCrossProcess
// (go-plugin's TestHelperProcess pattern), so no extra binary is built.
const (
	helperEnv    = "MDSHM_TEST_HELPER"
	helperJobEnv = "MDSHM_TEST_JOB"
	byeHeader    = "bye"
)

// TestCrossProcess exchanges frames with a second process through the rings:
// rank 1 (the re-executed test binary) echoes every frame back until told to
// stop, then closes, which rank 0 must see as PeerDown. It runs with large
// frames through the ring and again read from the other process's memory.
//
// In a pid namespace of its own that shares /dev/shm (as containers may),
// the child's pid names no process here, or another one, and this one's
// none there: large frames take the ring, and each side watches the other
// through its segment's lock. Connect once failed there ("process N
// exited"); a killed child must still be reported down.
func TestCrossProcess(t *testing.T) {
	t.Run("ring", func(t *testing.T) {
		t.Setenv(envSingleCopy, "off")
		crossProcess(t, nil, false)
	})
	t.Run("process_vm_readv", func(t *testing.T) {
		requireSingleCopy(t) // through the environment: the child inherits it
		crossProcess(t, nil, false)
	})
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprintf("other pid namespace, killed=%v", kill), func(t *testing.T) {
			if os.Geteuid() != 0 {
				t.Skip("a pid namespace needs root (unshare --pid)")
			}
			unshare, err := exec.LookPath("unshare")
			if err != nil {
				t.Skip("no unshare(1) to make a pid namespace with")
			}
			// --kill-child: the child (pid 1 there) dies with unshare.
			crossProcess(t, []string{unshare, "--pid", "--fork", "--kill-child"}, kill)
		})
	}
}

// crossProcess runs the exchange with the child started through wrap, and
// ends it with a goodbye or, with kill set, by killing it.
func crossProcess(t *testing.T, wrap []string, kill bool) {
	jobID := fmt.Sprintf("xproc-%d-%s", os.Getpid(), strings.NewReplacer("/", "-", " ", "-", ",", "", "=", "-").Replace(t.Name()))
	argv := append(wrap, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperJobEnv+"="+jobID)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	toChild, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	fromChild, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	h := newRecorder(t)
	sd := New(testLogger(t))
	ctx := context.Background()
	l, err := sd.Open(ctx, sdi.OpenParams{Rank: 0, Size: 2, Host: "h", JobID: jobID, Secret: []byte("x"), Handler: h, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { sd.Close(context.Background()) })
	if _, err := fmt.Fprintf(toChild, "%x\n", l.Addr); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(fromChild).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the child's card: %v (stderr: %s)", err, stderr.String())
	}
	peerCard, err := hex.DecodeString(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("child's card %q: %v", line, err)
	}
	if err := sd.Connect(ctx, 1, peerCard); err != nil {
		t.Fatalf("Connect to the child: %v", err)
	}

	sizes := []int{0, 1, 100, l.Caps.MaxEager, l.Caps.MaxFrame}
	for i := range uint64(300) {
		size := sizes[i%uint64(len(sizes))]
		mustSend(t, sd, &sdi.Frame{Peer: 1, Header: u64(i), Payload: pattern(i, size)})
		m := h.next(t)
		if m.from != 1 || binary.LittleEndian.Uint64(m.header) != i || !bytes.Equal(m.payload, pattern(i, size)) {
			t.Fatalf("echo %d: from %d, header %x, %d payload bytes (want %d)", i, m.from, m.header, len(m.payload), size)
		}
	}
	if kill {
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	} else {
		mustSend(t, sd, &sdi.Frame{Peer: 1, Header: []byte(byeHeader)})
	}
	d := h.nextDown(t)
	if d.peer != 1 || !errors.Is(d.err, sdi.ErrPeerUnreachable) {
		t.Fatalf("PeerDown(%d, %v), want rank 1 and ErrPeerUnreachable", d.peer, d.err)
	}
	if kill {
		return
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v; stderr:\n%s", err, stderr.String())
	}
}

// TestHelperProcess is rank 1 of TestCrossProcess; it does nothing in a
// normal test run.
func TestHelperProcess(t *testing.T) {
	run := runHelper
	switch os.Getenv(helperEnv) {
	case "1":
	case helperDying:
		run = runDyingSender
	case helperFull:
		run = runFullDevShm
	default:
		t.Skip("helper process for TestCrossProcess and TestSenderDiesBeforeRead")
	}
	// Exit explicitly: the test framework's own output on stdout would
	// otherwise follow the card line, and the parent reads the exit code.
	if err := run(t, os.Stdin, os.Stdout, os.Getenv(helperJobEnv)); err != nil || t.Failed() {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runHelper(t *testing.T, in io.Reader, out io.Writer, jobID string) error {
	ctx := context.Background()
	logger := hclog.New(&hclog.LoggerOptions{Name: "helper", Output: os.Stderr, Level: hclog.Warn})
	h := newRecorder(t)
	sd := New(logger)
	l, err := sd.Open(ctx, sdi.OpenParams{Rank: 1, Size: 2, Host: "h", JobID: jobID, Secret: []byte("x"), Handler: h, Logger: logger})
	if err != nil {
		return err
	}
	defer sd.Close(ctx)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the parent's card: %w", err)
	}
	parentCard, err := hex.DecodeString(strings.TrimSpace(line))
	if err != nil {
		return err
	}
	if err := sd.Connect(ctx, 0, parentCard); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(out, "%x\n", l.Addr); err != nil {
		return err
	}
	for m := range h.msgs {
		if string(m.header) == byeHeader {
			return sd.Close(ctx)
		}
		for {
			_, err := sd.Send(&sdi.Frame{Peer: 0, Header: m.header, Payload: m.payload})
			if errors.Is(err, sdi.ErrWouldBlock) {
				continue
			}
			if err != nil {
				return err
			}
			break
		}
	}
	return nil
}
