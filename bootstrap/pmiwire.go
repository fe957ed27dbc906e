package bootstrap

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The two PMI wire formats. Both carry a command and key=value attributes.
//
// PMI-1 sends one line per message, attributes separated by spaces, the
// command first:
//
//	cmd=get kvsname=kvs_1_0 key=md.0.kaG9zdA.0\n
//
// PMI-2 sends a 6-character decimal length (left-aligned, space-padded),
// then that many bytes of attributes each ended by ';', where ";;" inside a
// value stands for one ';':
//
//	30    cmd=kvs-get;srcid=-1;key=K;
//
// Both start the same way: the client sends the PMI-1 line
// "cmd=init pmi_version=V pmi_subversion=S" and the manager answers with a
// PMI-1 line; after that a PMI-2 client switches to the framed format.

// maxPMIMessage bounds one message from the manager. Values are at most
// about a kilobyte; the bound keeps a broken manager from making a rank
// allocate without end.
const maxPMIMessage = 64 << 10

// errBadPMI marks a message from the manager that does not parse.
var errBadPMI = errors.New("bootstrap: malformed PMI message")

// pmiMsg is one parsed message.
type pmiMsg struct {
	cmd   string
	attrs map[string]string
}

func (m *pmiMsg) get(k string) (string, bool) {
	v, ok := m.attrs[k]
	return v, ok
}

// num reads a decimal attribute, naming it when it is missing or wrong.
func (m *pmiMsg) num(k string) (int, error) {
	v, ok := m.attrs[k]
	if !ok {
		return 0, fmt.Errorf("%w: %s has no %s", errBadPMI, m.cmd, k)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %s=%.20q is not a number", errBadPMI, m.cmd, k, v)
	}
	return n, nil
}

// rc is the message's return code; a message without one succeeded (Hydra
// leaves it out of barrier_out and finalize_ack).
func (m *pmiMsg) rc() (int, error) {
	if _, ok := m.attrs["rc"]; !ok {
		return 0, nil
	}
	return m.num("rc")
}

// addAttr records k=v, refusing what no manager sends.
func (m *pmiMsg) addAttr(k, v string) error {
	if k == "" {
		return fmt.Errorf("%w: empty attribute name", errBadPMI)
	}
	if k == "cmd" {
		if m.cmd != "" {
			return fmt.Errorf("%w: two commands", errBadPMI)
		}
		if v == "" || strings.IndexFunc(v, notCmdRune) >= 0 {
			return fmt.Errorf("%w: command %.40q", errBadPMI, v)
		}
		m.cmd = v
		return nil
	}
	if m.cmd == "" {
		return fmt.Errorf("%w: attribute %.20q before the command", errBadPMI, k)
	}
	if _, dup := m.attrs[k]; dup {
		return fmt.Errorf("%w: %s: attribute %.20q twice", errBadPMI, m.cmd, k)
	}
	m.attrs[k] = v
	return nil
}

// notCmdRune reports what cannot be in a command name (get_result,
// kvs-fence-response, ...).
func notCmdRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
}

// parsePMI1 parses one PMI-1 line without its newline.
func parsePMI1(line string) (*pmiMsg, error) {
	m := &pmiMsg{attrs: map[string]string{}}
	for _, tok := range strings.Fields(line) {
		k, v, ok := strings.Cut(tok, "=")
		if !ok {
			return nil, fmt.Errorf("%w: %.40q has no '='", errBadPMI, tok)
		}
		if err := m.addAttr(k, v); err != nil {
			return nil, err
		}
	}
	if m.cmd == "" {
		return nil, fmt.Errorf("%w: line %.60q has no cmd", errBadPMI, line)
	}
	return m, nil
}

// formatPMI1 builds a PMI-1 line. Values must not hold spaces or newlines;
// callers pass only numbers, names from the manager and base64url text.
func formatPMI1(cmd string, kv ...string) string {
	var b strings.Builder
	b.WriteString("cmd=")
	b.WriteString(cmd)
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteByte(' ')
		b.WriteString(kv[i])
		b.WriteByte('=')
		b.WriteString(kv[i+1])
	}
	b.WriteByte('\n')
	return b.String()
}

// readPMI1 reads one PMI-1 line.
func readPMI1(r *bufio.Reader) (*pmiMsg, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		line = append(line, frag...)
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(line) > maxPMIMessage {
				return nil, fmt.Errorf("%w: line longer than %d bytes", errBadPMI, maxPMIMessage)
			}
			continue
		}
		if errors.Is(err, io.EOF) && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if len(line) > maxPMIMessage {
		return nil, fmt.Errorf("%w: line longer than %d bytes", errBadPMI, maxPMIMessage)
	}
	return parsePMI1(strings.TrimRight(string(line), "\r\n"))
}

// parsePMI2 parses the body of one PMI-2 message.
func parsePMI2(body string) (*pmiMsg, error) {
	m := &pmiMsg{attrs: map[string]string{}}
	for len(body) > 0 {
		k, rest, ok := strings.Cut(body, "=")
		if !ok {
			return nil, fmt.Errorf("%w: %.40q has no '='", errBadPMI, body)
		}
		if strings.Contains(k, ";") {
			return nil, fmt.Errorf("%w: attribute name %.40q holds ';'", errBadPMI, k)
		}
		var v strings.Builder
		i := 0
		for {
			j := strings.IndexByte(rest[i:], ';')
			if j < 0 {
				return nil, fmt.Errorf("%w: attribute %.20q has no ending ';'", errBadPMI, k)
			}
			v.WriteString(rest[i : i+j])
			i += j
			if i+1 < len(rest) && rest[i+1] == ';' {
				v.WriteByte(';')
				i += 2
				continue
			}
			i++
			break
		}
		if err := m.addAttr(k, v.String()); err != nil {
			return nil, err
		}
		body = rest[i:]
	}
	if m.cmd == "" {
		return nil, fmt.Errorf("%w: message has no cmd", errBadPMI)
	}
	return m, nil
}

// formatPMI2 builds a framed PMI-2 message; ';' in values is doubled.
func formatPMI2(cmd string, kv ...string) string {
	var b strings.Builder
	b.WriteString("cmd=")
	b.WriteString(cmd)
	b.WriteByte(';')
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(kv[i])
		b.WriteByte('=')
		b.WriteString(strings.ReplaceAll(kv[i+1], ";", ";;"))
		b.WriteByte(';')
	}
	return fmt.Sprintf("%-6d", b.Len()) + b.String()
}

// readPMI2 reads one framed PMI-2 message.
func readPMI2(r io.Reader) (*pmiMsg, error) {
	var hdr [6]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(hdr[:])))
	if err != nil || n < 1 || n > maxPMIMessage {
		return nil, fmt.Errorf("%w: length field %q not in [1, %d]", errBadPMI, hdr[:], maxPMIMessage)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return parsePMI2(string(body))
}
