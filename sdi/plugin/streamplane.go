package plugin

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/proto/sdiv1"
)

// The stream plane batches records into Transfer chunks: every record a
// sender writes while the previous chunk is on its way joins the next
// chunk, so a busy sender pays one gRPC message per batch, not per frame.
//
// Flow control: the host may have at most window bytes of frame records
// that the plugin has not released (its subdevice still owns their
// buffers); the plugin returns space with credit records. Towards the host,
// the plugin holds at most window bytes not yet handed to gRPC, whose own
// flow control then stops it when the host does not read.

// hostStream is the host's side of the stream plane.
type hostStream struct {
	st     sdiv1.SubDevice_TransferClient
	h      sdi.Handler
	lim    limits
	window int
	fail   func(error)

	mu          sync.Mutex
	pending     batch
	outstanding int

	hmu     sync.Mutex // held while records are handed to the Handler
	kick    chan struct{}
	quit    chan struct{}
	stopped atomic.Bool
	wg      sync.WaitGroup
}

func newHostStream(st sdiv1.SubDevice_TransferClient, h sdi.Handler, lim limits, window int, fail func(error)) *hostStream {
	p := &hostStream{st: st, h: h, lim: lim, window: window, fail: fail,
		kick: make(chan struct{}, 1), quit: make(chan struct{})}
	p.wg.Add(2)
	go p.sender()
	go p.receiver()
	return p
}

func (p *hostStream) send(peer sdi.Rank, header, payload []byte) error {
	n := recordLen(len(header), len(payload))
	p.mu.Lock()
	if p.outstanding+n > p.window {
		p.mu.Unlock()
		return sdi.ErrWouldBlock
	}
	p.outstanding += n
	p.pending.add(kindFrame, peer, 0, header, payload)
	p.mu.Unlock()
	wake(p.kick)
	return nil
}

func (p *hostStream) sender() {
	defer p.wg.Done()
	for {
		select {
		case <-p.kick:
		case <-p.quit:
			return
		}
		p.mu.Lock()
		chunks := p.pending.take()
		p.mu.Unlock()
		for _, c := range chunks {
			// The chunk is not reused: gRPC may still read it after Send.
			err := p.st.Send(&sdiv1.Transfer_Outbound{Msg: &sdiv1.Transfer_Outbound_Chunk{Chunk: &sdiv1.Transfer_Chunk{Records: c}}})
			if err != nil {
				if !p.stopped.Load() {
					p.fail(fmt.Errorf("%w: transfer stream: %v", ErrPluginExited, err))
				}
				return
			}
		}
	}
}

func (p *hostStream) receiver() {
	defer p.wg.Done()
	for {
		in, err := p.st.Recv()
		if err != nil {
			if !p.stopped.Load() {
				p.fail(fmt.Errorf("%w: transfer stream: %v", ErrPluginExited, err))
			}
			return
		}
		c := in.GetChunk()
		if c == nil {
			p.fail(fmt.Errorf("%w: transfer stream: a message other than a chunk after attach", ErrProtocol))
			return
		}
		if err := p.handle(c.GetRecords()); err != nil {
			p.fail(fmt.Errorf("%w: transfer stream: %w", ErrProtocol, err))
			return
		}
	}
}

// handle hands the records of one chunk to the Handler.
func (p *hostStream) handle(b []byte) error {
	p.hmu.Lock()
	defer p.hmu.Unlock()
	for len(b) > 0 {
		if p.stopped.Load() {
			return nil
		}
		rec, n, err := decodeRecord(b, p.lim)
		if err != nil {
			return err
		}
		b = b[n:]
		if rec.kind == kindCredit {
			p.mu.Lock()
			p.outstanding = max(p.outstanding-int(rec.aux), 0)
			p.mu.Unlock()
			continue
		}
		if !deliver(p.h, rec) {
			return fmt.Errorf("record kind %d does not travel to the host", rec.kind)
		}
	}
	return nil
}

// poll has nothing to do: records arrive on the receiver goroutine.
func (p *hostStream) poll() int { return 0 }
func (p *hostStream) idle()     {}

// stop ends the goroutines; the caller has cancelled the stream's context,
// which ends a Recv in progress.
func (p *hostStream) stop() {
	if p.stopped.Swap(true) {
		return
	}
	close(p.quit)
	p.wg.Wait()
	p.hmu.Lock()
	p.hmu.Unlock() //nolint:staticcheck // waits for a chunk being handed over
}

// pluginStream is the plugin's side of the stream plane.
type pluginStream struct {
	st     sdiv1.SubDevice_TransferServer
	srv    *server
	lim    limits
	window int

	mu      sync.Mutex
	cond    *sync.Cond // signalled when pending shrinks or the plane stops
	pending batch
	credit  uint64
	stopped bool

	kick chan struct{}
	quit chan struct{}
	wg   sync.WaitGroup
}

func newPluginStream(st sdiv1.SubDevice_TransferServer, srv *server, lim limits, window int) *pluginStream {
	p := &pluginStream{st: st, srv: srv, lim: lim, window: window, kick: make(chan struct{}, 1), quit: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.writer()
	return p
}

// receive reads frame chunks until the stream ends, handing each frame to
// the subdevice. It runs on the Transfer handler's goroutine.
func (p *pluginStream) receive() error {
	for {
		out, err := p.st.Recv()
		if err != nil {
			return err
		}
		c := out.GetChunk()
		if c == nil {
			return fmt.Errorf("%w: a message other than a chunk after attach", ErrProtocol)
		}
		b := c.GetRecords()
		for len(b) > 0 {
			rec, n, err := decodeRecord(b, p.lim)
			if err == nil && rec.kind != kindFrame {
				err = fmt.Errorf("record kind %d does not travel to the plugin", rec.kind)
			}
			if err != nil {
				return fmt.Errorf("%w: %w", ErrProtocol, err)
			}
			b = b[n:]
			p.srv.dispatch(rec, func() { p.addCredit(n) })
		}
	}
}

func (p *pluginStream) addCredit(n int) {
	p.mu.Lock()
	p.credit += uint64(n)
	p.mu.Unlock()
	wake(p.kick)
}

func (p *pluginStream) put(kind uint8, peer sdi.Rank, header, payload []byte) bool {
	n := recordLen(len(header), len(payload))
	p.mu.Lock()
	for p.pending.bytes > 0 && p.pending.bytes+n > p.window && !p.stopped {
		p.cond.Wait()
	}
	if p.stopped {
		p.mu.Unlock()
		return false
	}
	p.pending.add(kind, peer, 0, header, payload)
	p.mu.Unlock()
	wake(p.kick)
	return true
}

func (p *pluginStream) writer() {
	defer p.wg.Done()
	for {
		select {
		case <-p.kick:
		case <-p.quit:
			return
		}
		p.mu.Lock()
		for p.credit > 0 {
			c := min(p.credit, 1<<31)
			p.credit -= c
			p.pending.add(kindCredit, 0, uint32(c), nil, nil)
		}
		chunks := p.pending.take()
		p.cond.Broadcast()
		p.mu.Unlock()
		for _, c := range chunks {
			if err := p.st.Send(&sdiv1.Transfer_Inbound{Msg: &sdiv1.Transfer_Inbound_Chunk{Chunk: &sdiv1.Transfer_Chunk{Records: c}}}); err != nil {
				p.stopLocked()
				return
			}
		}
	}
}

func (p *pluginStream) stopLocked() {
	p.mu.Lock()
	p.stopped = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *pluginStream) stop() {
	p.mu.Lock()
	already := p.stopped
	p.stopped = true
	p.cond.Broadcast()
	p.mu.Unlock()
	if !already {
		close(p.quit)
	}
	p.wg.Wait()
}

// chunkBytes bounds a chunk of several records. gRPC marshals and reads
// a message into pooled buffers of up to 1 MiB and allocates larger ones
// afresh, and a batch that grew to the whole window would be copied each
// time it doubled: bounded chunks keep every byte at one copy into the
// batch. A record larger than this travels alone.
const chunkBytes = 512 << 10

// batch collects records for the stream plane in chunks of at most
// chunkBytes. It is not safe for concurrent use.
type batch struct {
	chunks [][]byte
	bytes  int // in chunks
	// last is how much the previous take held, up to chunkBytes: under
	// load chunks fill, and a new one is made that large at once.
	last int
}

// add appends one record.
func (b *batch) add(kind uint8, peer sdi.Rank, aux uint32, header, payload []byte) {
	n := recordLen(len(header), len(payload))
	k := len(b.chunks) - 1
	if k < 0 || len(b.chunks[k])+n > chunkBytes && len(b.chunks[k]) > 0 {
		b.chunks = append(b.chunks, make([]byte, 0, max(n, min(chunkBytes, b.last))))
		k++
	}
	c := b.chunks[k]
	if len(c)+n > cap(c) {
		c = slices.Grow(c, max(n, len(c))) // doubles, up to chunkBytes
	}
	l := len(c)
	c = c[:l+n]
	putRecord(c[l:], kind, peer, aux, header, payload)
	b.chunks[k] = c
	b.bytes += n
}

// take returns the chunks collected so far and empties the batch.
func (b *batch) take() [][]byte {
	c := b.chunks
	b.last = min(b.bytes, chunkBytes)
	b.chunks, b.bytes = nil, 0
	return c
}

// wake nudges the goroutine that waits on c, a channel of capacity one; a
// nudge already pending is enough.
func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
