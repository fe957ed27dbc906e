package bootstrap

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// protocolVersion changes whenever a message's meaning does; the service
// refuses a hello of another version rather than guessing. Version 2 carries
// keys as bytes (see wirePut).
//
// A new request that an older peer may not know leaves the version alone,
// so that ranks and mdrun of either age still work together: the
// service's reply to hello lists such requests it takes (Ops), and a rank
// sends one only to a service that listed it, since a service drops a
// rank that sends a request it does not know. An older rank never sends
// one, and an older rank ignores the list.
const protocolVersion = 2

// Limits on what crosses the wire. Business cards are a few hundred bytes;
// the limits only keep a broken or hostile peer from making the service
// allocate without bound.
const (
	maxMessage = 2 << 20  // bytes of JSON in one message
	maxHello   = 4 << 10  // bytes of JSON in a hello, read before the peer is known; a real one is under 300
	maxKey     = 256      // bytes of a key
	maxValue   = 64 << 10 // bytes of one value
	maxPuts    = 1 << 20  // bytes one fence's puts take in its message (putWireSize), well under maxMessage
)

// Operations. Requests come from the rank, replies from the service.
const (
	opHello    = "hello"
	opFence    = "fence"
	opGet      = "get"
	opAbort    = "abort"
	opFinalize = "finalize"
	opLost     = "lost"  // a rank lost another (Rank, Reason); no reply. Listed in Ops.
	opOK       = "ok"    // reply: the request succeeded
	opError    = "error" // reply: the request failed; Code says how
)

// Error codes in an opError reply.
const (
	errCodeNotFound   = "not_found"   // get: no such key
	errCodeRefused    = "refused"     // hello: wrong version, rank or secret
	errCodeFence      = "fence"       // fence: cannot complete
	errCodeBadRequest = "bad_request" // a well-formed request that makes no sense
)

// message is every message of the protocol; each op uses a few fields.
type message struct {
	Op      string    `json:"op"`
	ID      uint64    `json:"id,omitempty"`
	Version int       `json:"version,omitempty"` // hello
	Rank    int       `json:"rank,omitempty"`    // hello, get, lost
	Secret  string    `json:"secret,omitempty"`  // hello, hex
	Key     []byte    `json:"key,omitempty"`     // get
	Value   []byte    `json:"value,omitempty"`   // ok to get
	Puts    []wirePut `json:"puts,omitempty"`    // fence
	Code    int       `json:"code,omitempty"`    // abort
	Reason  string    `json:"reason,omitempty"`  // abort, lost; error reply text
	ErrCode string    `json:"err,omitempty"`     // error reply
	Size    int       `json:"size,omitempty"`    // hello
	JobID   string    `json:"jobid,omitempty"`   // hello
	Ops     []string  `json:"ops,omitempty"`     // ok to hello: requests beyond the version's it takes
}

// putWireSize bounds the bytes a put of a key and value of these lengths
// takes in a fence message: both in base64, and the JSON around them
// ({"key":"","value":""},). Limits count this, not the raw lengths: many
// small puts take three times their bytes on the wire, and a fence of
// them once outgrew maxMessage, which closed the rank's connection.
func putWireSize(key, value int) int {
	b64 := func(n int) int { return (n + 2) / 3 * 4 }
	return b64(key) + b64(value) + len(`{"key":"","value":""},`)
}

// wirePut is one put of a fence. Keys are any bytes, so they travel as
// bytes (base64 in JSON): a JSON string would turn every invalid UTF-8
// sequence into U+FFFD, and distinct keys into one.
type wirePut struct {
	Key   []byte `json:"key"`
	Value []byte `json:"value"`
}

// errBadMessage marks input that does not follow the protocol; the
// connection it came from is dropped.
var errBadMessage = errors.New("bootstrap: bad message")

// writeMessage encodes m as one length-prefixed message.
func writeMessage(w io.Writer, m *message) error {
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("bootstrap: encode %s: %w", m.Op, err)
	}
	if len(body) > maxMessage {
		return fmt.Errorf("bootstrap: %s message of %d bytes exceeds %d", m.Op, len(body), maxMessage)
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("bootstrap: send %s: %w", m.Op, err)
	}
	return nil
}

// readMessage reads one length-prefixed message of at most limit bytes and
// checks it. The length is checked before the body is read, so an oversized
// claim costs nothing. Errors from r come back as they are (io.EOF for a
// clean close); bad content wraps errBadMessage.
func readMessage(r io.Reader, limit uint32) (*message, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > limit {
		return nil, fmt.Errorf("%w: length %d not in [1, %d]", errBadMessage, n, limit)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return decodeMessage(body)
}

// decodeMessage parses and validates one message body.
func decodeMessage(body []byte) (*message, error) {
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: %w", errBadMessage, err)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// validate checks what every receiver relies on, so handlers can index and
// allocate without checking again.
func (m *message) validate() error {
	switch m.Op {
	case opHello, opFence, opGet, opAbort, opFinalize, opLost, opOK, opError:
	default:
		return fmt.Errorf("%w: unknown op %q", errBadMessage, m.Op)
	}
	if m.Rank < 0 || m.Rank > math.MaxInt32 {
		return fmt.Errorf("%w: rank %d out of range", errBadMessage, m.Rank)
	}
	if m.Size < 0 || m.Size > math.MaxInt32 {
		return fmt.Errorf("%w: size %d out of range", errBadMessage, m.Size)
	}
	if len(m.Key) > maxKey {
		return fmt.Errorf("%w: key of %d bytes exceeds %d", errBadMessage, len(m.Key), maxKey)
	}
	if len(m.Value) > maxValue {
		return fmt.Errorf("%w: value of %d bytes exceeds %d", errBadMessage, len(m.Value), maxValue)
	}
	total := 0
	for _, p := range m.Puts {
		if len(p.Key) > maxKey || len(p.Value) > maxValue {
			return fmt.Errorf("%w: put %.32q too large", errBadMessage, p.Key)
		}
		total += putWireSize(len(p.Key), len(p.Value))
	}
	if total > maxPuts {
		return fmt.Errorf("%w: puts of %d bytes exceed %d", errBadMessage, total, maxPuts)
	}
	return nil
}
