package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// Handshake messages. The acceptor speaks first, so a stranger that connects
// and stays silent learns nothing but a nonce and is dropped at the deadline.
//
//	acceptor  -> connector  hello:  "mdth" | version | nonceA[32]
//	connector -> acceptor   reply:  "mdth" | version | rank (LE32) | session (LE64) |
//	                                lane (LE16) | lanes (LE16) | nonceC[32] |
//	                                HMAC-SHA256(secret, nonceA || job id || rank || session || lane || lanes)
//	acceptor  -> connector  accept: "mdth" | version | rank (LE32) |
//	                                HMAC-SHA256(secret, "accept" || nonceC || job id || rank)
//
// A session is one Connect: its lanes (one connection per interface pair)
// share a random session id, so the acceptor can tell the lanes of a
// reconnect from those of the connection it replaces.
//
// The acceptor closes the connection without a word when the reply is wrong,
// so a prober cannot tell a bad secret from a bad rank. The accept message
// proves to the connector that the listener belongs to the rank and job it
// meant to reach: a port reused by another job, or an address that leads to
// another process (a docker0-like bridge, loopback on another host), is
// refused rather than trusted.
const (
	hsMagic   = "mdth"
	hsVersion = 2
	nonceLen  = 32
	macLen    = sha256.Size
	laneLen   = 8 + 2 + 2 // session, lane, lanes
	helloLen  = 4 + 1 + nonceLen
	replyLen  = 4 + 1 + 4 + laneLen + nonceLen + macLen
	acceptLen = 4 + 1 + 4 + macLen
)

// laneID says which connection of which Connect a stream is.
type laneID struct {
	session     uint64
	lane, lanes uint16
}

func (l laneID) put(b []byte) {
	binary.LittleEndian.PutUint64(b, l.session)
	binary.LittleEndian.PutUint16(b[8:], l.lane)
	binary.LittleEndian.PutUint16(b[10:], l.lanes)
}

func getLaneID(b []byte) laneID {
	return laneID{
		session: binary.LittleEndian.Uint64(b),
		lane:    binary.LittleEndian.Uint16(b[8:]),
		lanes:   binary.LittleEndian.Uint16(b[10:]),
	}
}

var acceptLabel = []byte("accept")

// auth holds what both sides of a handshake need. It is immutable after
// Open and safe for concurrent use.
type auth struct {
	secret []byte
	jobID  string
	rank   sdi.Rank
	size   int
}

func (a *auth) mac(label, nonce []byte, rank sdi.Rank, extra []byte) []byte {
	m := hmac.New(sha256.New, a.secret)
	m.Write(label)
	m.Write(nonce)
	m.Write([]byte(a.jobID))
	var r [4]byte
	binary.LittleEndian.PutUint32(r[:], uint32(rank))
	m.Write(r[:])
	m.Write(extra)
	return m.Sum(nil)
}

func checkPrefix(b []byte, what string) error {
	if string(b[:4]) != hsMagic {
		return fmt.Errorf("bad %s magic %q, want %q (not a tcp subdevice?)", what, b[:4], hsMagic)
	}
	if b[4] != hsVersion {
		return fmt.Errorf("%s version %d, this build speaks %d", what, b[4], hsVersion)
	}
	return nil
}

// accept runs the acceptor's side on rw and returns the authenticated rank
// of the connector and which lane of its session this is. It calls
// register with both before it answers: the connector cannot go on (send,
// reconnect) until then, so registrations happen in the order the connector
// made its connections. The caller bounds it with a deadline.
func (a *auth) accept(rw io.ReadWriter, register func(sdi.Rank, laneID)) (sdi.Rank, laneID, error) {
	var hello [helloLen]byte
	copy(hello[:], hsMagic)
	hello[4] = hsVersion
	nonce := hello[5:]
	rand.Read(nonce)
	if _, err := rw.Write(hello[:]); err != nil {
		return 0, laneID{}, fmt.Errorf("sending hello: %w", err)
	}
	// The prefix first, so a stranger speaking another protocol is named
	// as such at once rather than after the deadline.
	var reply [replyLen]byte
	if _, err := io.ReadFull(rw, reply[:5]); err != nil {
		return 0, laneID{}, fmt.Errorf("reading reply: %w", err)
	}
	if err := checkPrefix(reply[:], "reply"); err != nil {
		return 0, laneID{}, err
	}
	if _, err := io.ReadFull(rw, reply[5:]); err != nil {
		return 0, laneID{}, fmt.Errorf("reading reply: %w", err)
	}
	rank := sdi.Rank(binary.LittleEndian.Uint32(reply[5:]))
	lid := reply[9 : 9+laneLen]
	nonceC := reply[9+laneLen : 9+laneLen+nonceLen]
	mac := reply[9+laneLen+nonceLen:]
	if rank < 0 || int(rank) >= a.size {
		return 0, laneID{}, fmt.Errorf("claimed rank %d out of range [0,%d)", rank, a.size)
	}
	if !hmac.Equal(mac, a.mac(nil, nonce, rank, lid)) {
		return 0, laneID{}, fmt.Errorf("authentication failed for claimed rank %d (wrong job secret or job id)", rank)
	}
	id := getLaneID(lid)
	register(rank, id)
	var acc [acceptLen]byte
	copy(acc[:], hsMagic)
	acc[4] = hsVersion
	binary.LittleEndian.PutUint32(acc[5:], uint32(a.rank))
	copy(acc[9:], a.mac(acceptLabel, nonceC, a.rank, nil))
	if _, err := rw.Write(acc[:]); err != nil {
		return 0, laneID{}, fmt.Errorf("sending accept: %w", err)
	}
	return rank, id, nil
}

// connect runs the connector's side on rw for lane id and checks that the
// acceptor is rank want of this job. The caller bounds it with a deadline.
func (a *auth) connect(rw io.ReadWriter, want sdi.Rank, id laneID) error {
	var hello [helloLen]byte
	if _, err := io.ReadFull(rw, hello[:]); err != nil {
		return fmt.Errorf("reading hello: %w", err)
	}
	if err := checkPrefix(hello[:], "hello"); err != nil {
		return err
	}
	var reply [replyLen]byte
	copy(reply[:], hsMagic)
	reply[4] = hsVersion
	binary.LittleEndian.PutUint32(reply[5:], uint32(a.rank))
	lid := reply[9 : 9+laneLen]
	id.put(lid)
	nonceC := reply[9+laneLen : 9+laneLen+nonceLen]
	rand.Read(nonceC)
	copy(reply[9+laneLen+nonceLen:], a.mac(nil, hello[5:], a.rank, lid))
	if _, err := rw.Write(reply[:]); err != nil {
		return fmt.Errorf("sending reply: %w", err)
	}
	var acc [acceptLen]byte
	if _, err := io.ReadFull(rw, acc[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("peer refused the handshake (wrong job secret or job id, or our rank %d is not in its job): %w", a.rank, err)
		}
		return fmt.Errorf("reading accept: %w", err)
	}
	if err := checkPrefix(acc[:], "accept"); err != nil {
		return err
	}
	if got := sdi.Rank(binary.LittleEndian.Uint32(acc[5:])); got != want {
		return fmt.Errorf("listener is rank %d, want rank %d", got, want)
	}
	if !hmac.Equal(acc[9:], a.mac(acceptLabel, nonceC, want, nil)) {
		return fmt.Errorf("listener failed to prove it belongs to this job (wrong job secret or job id)")
	}
	return nil
}
