package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// roomRing is the ring size of the tests here: the smallest, so that a
// tmpfs of a few hundred KiB holds a pair's rings.
const roomRing = minRingBytes

// Every payload through the ring: the rings' memory is what is tested,
// and a frame sent by descriptor completes later, which exchange does not
// wait for.
var roomConfig = []byte(fmt.Sprintf(`{"ring_bytes": %d, "single_copy": false}`, roomRing))

// openUnconnected opens n ranks of a job without connecting any pair.
func openUnconnected(t testing.TB, n int) *job {
	return openJob(t, n, jobOpts{config: roomConfig, host: func(int) string { return "host-a" }})
}

// connectPair connects ranks a and b both ways.
func connectPair(j *job, a, b int) error {
	ctx := context.Background()
	if err := j.sds[a].Connect(ctx, sdi.Rank(b), j.local[b].Addr); err != nil {
		return err
	}
	return j.sds[b].Connect(ctx, sdi.Rank(a), j.local[a].Addr)
}

// exchange sends frames of every size up to MaxFrame both ways between
// ranks a and b, enough to go round each ring several times, and checks
// each one delivered.
func exchange(j *job, a, b int) error {
	maxFrame := j.local[a].Caps.MaxFrame
	for i := range uint64(4 * roomRing / maxFrame * 4) {
		for _, p := range [][2]int{{a, b}, {b, a}} {
			n := int(i*7919) % (maxFrame + 1)
			hdr := binary.LittleEndian.AppendUint64(nil, i)
			if err := sendRetry(j.sds[p[0]], &sdi.Frame{Peer: sdi.Rank(p[1]), Header: hdr, Payload: pattern(i, n)}); err != nil {
				return fmt.Errorf("send %d from %d to %d: %w", i, p[0], p[1], err)
			}
			m, err := j.hs[p[1]].await()
			if err != nil {
				return fmt.Errorf("frame %d from %d to %d: %w", i, p[0], p[1], err)
			}
			if int(m.from) != p[0] || !bytes.Equal(m.header, hdr) || !bytes.Equal(m.payload, pattern(i, n)) {
				return fmt.Errorf("frame %d from %d to %d: got one from %d, header %x, %d bytes", i, p[0], p[1], m.from, m.header, len(m.payload))
			}
		}
	}
	return nil
}

// allocated is the memory tmpfs holds for rank r's segment.
func allocated(t *testing.T, j *job, r int) int64 {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(shmem.Dir, j.sds[r].(*device).seg.Name()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestUnconnectedRingsCostNoMemory: a segment holds a ring for every rank
// of the job, most of them (those on other hosts) never written. Their
// memory must stay unallocated when a peer attaches: the receiver's look
// for attached rings once read a word of every ring, which made tmpfs
// allocate a page of each, a page per rank of the job in every rank's
// segment.
func TestUnconnectedRingsCostNoMemory(t *testing.T) {
	mem := func(n int) int64 {
		j := openUnconnected(t, n)
		if err := connectPair(j, 0, 1); err != nil {
			t.Fatal(err)
		}
		if err := exchange(j, 0, 1); err != nil {
			t.Fatal(err)
		}
		return allocated(t, j, 0)
	}
	two, many := mem(2), mem(512)
	// The attach table of 512 ranks is a page, as is that of 2.
	if many > two {
		t.Fatalf("a job of 512 ranks allocates %d bytes of rank 0's segment, one of 2 ranks %d, for the same pair's traffic", many, two)
	}
}

// helperFull makes TestHelperProcess the body of TestFullDevShm.
const helperFull = "full-dev-shm"

// TestFullDevShm runs ranks in a mount namespace whose /dev/shm holds
// the rings of one pair and little more, as a container's small /dev/shm
// does. A touch of a tmpfs page there finds no room and kills the process
// with SIGBUS; instead, connecting a second pair must fail with an error
// that says /dev/shm is full (and wraps sdi.ErrPeerUnreachable, so the
// multidevice takes another subdevice), while the first pair goes round
// its rings unharmed.
func TestFullDevShm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small /dev/shm in a mount namespace needs root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1) to make a mount namespace with")
	}
	// Three segments' headers and attach tables, two rings (each
	// rounded to pages, and one page more where a ring straddles), and
	// four pages to spare: not two rings more.
	page := int64(pageBytes)
	ring := (int64(ringStride(roomRing)) + page - 1) / page * page
	size := 3*int64(ringOffset(3, 0, roomRing)) + 2*(ring+page) + 4*page
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", "sh", "-c",
		fmt.Sprintf(`mount -t tmpfs -o size=%d tmpfs %s && exec "$@"`, size, shmem.Dir), "sh",
		os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+helperFull)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ranks with a full /dev/shm: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// runFullDevShm is TestFullDevShm's body, in the namespace.
func runFullDevShm(t *testing.T, _ io.Reader, out io.Writer, _ string) error {
	j := openUnconnected(t, 3)
	if err := connectPair(j, 0, 1); err != nil {
		return fmt.Errorf("connecting the first pair: %w", err)
	}
	for _, p := range [][2]int{{0, 2}, {2, 1}} {
		err := j.sds[p[0]].Connect(context.Background(), sdi.Rank(p[1]), j.local[p[1]].Addr)
		if err == nil {
			return fmt.Errorf("Connect %d -> %d succeeded with /dev/shm full", p[0], p[1])
		}
		if !errors.Is(err, sdi.ErrPeerUnreachable) || !strings.Contains(err.Error(), "no space left on device") || !strings.Contains(err.Error(), shmem.Dir+" holds") {
			return fmt.Errorf("Connect %d -> %d: %w; want sdi.ErrPeerUnreachable saying how full %s is", p[0], p[1], err, shmem.Dir)
		}
		fmt.Fprintf(out, "Connect %d -> %d: %v\n", p[0], p[1], err)
	}
	return exchange(j, 0, 1)
}
