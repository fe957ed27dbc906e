package rdma

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// A connection request carries who dials whom and a proof that the dialer
// holds the job's secret:
//
//	0   "MDRD"      4 bytes
//	4   version     1 byte
//	5   zero        3 bytes
//	8   from        4 bytes  the dialing rank
//	12  to          4 bytes  the rank it means to reach
//	16  mac         16 bytes HMAC-SHA256(secret, job ID, the 16 bytes above), truncated
//
// 32 bytes in all: the smallest private-data limit of the connection
// managers (56 bytes for an InfiniBand RC connect) leaves room.
const (
	privateLen     = 32
	privateVersion = 1
	macLen         = 16
)

var privateMagic = [4]byte{'M', 'D', 'R', 'D'}

func handshakeMAC(secret []byte, job string, head []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(job))
	m.Write([]byte{0})
	m.Write(head)
	return m.Sum(nil)[:macLen]
}

func makePrivate(secret []byte, job string, from, to sdi.Rank) []byte {
	b := make([]byte, privateLen)
	copy(b, privateMagic[:])
	b[4] = privateVersion
	binary.LittleEndian.PutUint32(b[8:], uint32(from))
	binary.LittleEndian.PutUint32(b[12:], uint32(to))
	copy(b[16:], handshakeMAC(secret, job, b[:16]))
	return b
}

// checkPrivate returns the dialing rank of a request meant for rank me of
// a job of size ranks, or says why the request is not one.
func checkPrivate(b, secret []byte, job string, me sdi.Rank, size int) (sdi.Rank, error) {
	// Connection managers may pad private data with zeros.
	if len(b) < privateLen {
		return 0, fmt.Errorf("connection request with %d bytes of private data, want %d", len(b), privateLen)
	}
	if [4]byte(b[:4]) != privateMagic || b[4] != privateVersion {
		return 0, fmt.Errorf("connection request with magic %q version %d, not a multidevice rdma request of version %d", b[:4], b[4], privateVersion)
	}
	if !hmac.Equal(b[16:privateLen], handshakeMAC(secret, job, b[:16])) {
		return 0, fmt.Errorf("connection request that does not show this job's secret")
	}
	from := sdi.Rank(binary.LittleEndian.Uint32(b[8:]))
	to := sdi.Rank(binary.LittleEndian.Uint32(b[12:]))
	if to != me {
		return 0, fmt.Errorf("connection request from rank %d for rank %d, this is rank %d", from, to, me)
	}
	if from < 0 || int(from) >= size || from == me {
		return 0, fmt.Errorf("connection request from rank %d, outside a job of %d ranks", from, size)
	}
	return from, nil
}

// The business card the engine publishes wraps the provider's:
//
//	0   "MDRC"      4 bytes
//	4   rank        4 bytes
//	8   tag         8 bytes  HMAC-SHA256(secret, job ID, "card", rank), truncated
//	16  the provider's card
//
// so that Connect turns away the card of another job, or of another rank,
// at once: a refusal by a rank of this job means "not now" and is retried,
// which a card that can never work must not cost.
const (
	cardHead = 16
	cardTag  = 8
)

var cardMagic = [4]byte{'M', 'D', 'R', 'C'}

func cardMAC(secret []byte, job string, r sdi.Rank) []byte {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(r))
	return handshakeMAC(secret, job, append([]byte("card"), b[:]...))[:cardTag]
}

func makeCard(secret []byte, job string, me sdi.Rank, prov []byte) []byte {
	b := make([]byte, cardHead, cardHead+len(prov))
	copy(b, cardMagic[:])
	binary.LittleEndian.PutUint32(b[4:], uint32(me))
	copy(b[8:], cardMAC(secret, job, me))
	return append(b, prov...)
}

// openCard returns the provider's card inside peer's business card, or
// says why the card is not peer's in this job.
func openCard(b, secret []byte, job string, peer sdi.Rank) ([]byte, error) {
	switch {
	case len(b) <= cardHead || [4]byte(b[:4]) != cardMagic:
		return nil, fmt.Errorf("card %x is not a multidevice rdma card", b[:min(len(b), 8)])
	case sdi.Rank(binary.LittleEndian.Uint32(b[4:])) != peer:
		return nil, fmt.Errorf("the card is rank %d's, not rank %d's", binary.LittleEndian.Uint32(b[4:]), peer)
	case !hmac.Equal(b[8:cardHead], cardMAC(secret, job, peer)):
		return nil, errors.New("the card is of another job")
	}
	return b[cardHead:], nil
}
