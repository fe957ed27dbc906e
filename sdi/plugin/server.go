package plugin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hpc-multidevice/multidevice/internal/sched"
	"github.com/hpc-multidevice/multidevice/internal/shmem"
	"github.com/hpc-multidevice/multidevice/sdi"
	"github.com/hpc-multidevice/multidevice/sdi/proto/sdiv1"
)

// server is the plugin side: it serves one subdevice instance over gRPC
// and is that subdevice's Handler. Safe for concurrent use.
type server struct {
	sdiv1.UnimplementedSubDeviceServer
	sd  sdi.SubDevice
	log hclog.Logger
	// orphaned is called when the host goes away without Close; Serve
	// exits the process there. Nil in tests.
	orphaned func()

	mu     sync.Mutex
	opened bool
	caps   sdi.Caps
	// poller and idler are the subdevice as sdi.Poller and sdi.Idler when
	// its flags say so, set at Open; the ring goroutine polls through them.
	poller sdi.Poller
	idler  sdi.Idler
	lim    limits
	plane  pluginPlane
	// placer is set once a ring plane with a place area is attached;
	// Place and Deliver use it (place.go).
	placer   atomic.Pointer[placer]
	attached chan struct{} // closed once a plane is attached, or at Close
	closing  chan struct{} // closed when Close starts

	closed atomic.Bool
	// down records, per peer, that a PeerDown went to the host, so a
	// stream of failing frames reports the loss once.
	down []atomic.Bool

	tokMu   sync.Mutex
	tokens  map[uint64]pendingFrame
	nextTok uint64

	// dispatched counts frame records handed to the subdevice (accepted or
	// refused); Flush and Disconnect wait for the count the host sent.
	dispatched atomic.Uint64
	kick       chan struct{} // a SendDone came: a refused frame may fit now
}

type pendingFrame struct {
	peer    sdi.Rank
	release func()
}

func newServer(sd sdi.SubDevice, log hclog.Logger, orphaned func()) *server {
	return &server{sd: sd, log: log, orphaned: orphaned, tokens: make(map[uint64]pendingFrame),
		attached: make(chan struct{}), closing: make(chan struct{}), kick: make(chan struct{}, 1)}
}

func (s *server) GetInfo(ctx context.Context, _ *sdiv1.GetInfo_Request) (*sdiv1.GetInfo_Response, error) {
	info, err := s.sd.Info(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &sdiv1.GetInfo_Response{Name: info.Name, Version: info.Version, ApiVersions: info.APIVersions}, nil
}

func (s *server) Open(ctx context.Context, req *sdiv1.Open_Request) (*sdiv1.Open_Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opened {
		return nil, status.Error(codes.FailedPrecondition, "sdi/plugin: open: already open")
	}
	size := req.GetSize()
	if size <= 0 || size > 1<<30 {
		return nil, status.Errorf(codes.InvalidArgument, "sdi/plugin: open: job size %d", size)
	}
	local, err := s.sd.Open(ctx, sdi.OpenParams{
		Rank:       sdi.Rank(req.GetRank()),
		Size:       int(size),
		Host:       req.GetHost(),
		Site:       req.GetSite(),
		JobID:      req.GetJobId(),
		Secret:     req.GetSecret(),
		APIVersion: req.GetApiVersion(),
		Config:     req.GetConfig(),
		Handler:    (*serverHandler)(s),
		Logger:     s.log,
	})
	if err != nil {
		return nil, toStatus(err)
	}
	// A flag whose interface is missing would fail only later, on the
	// host, as "unsupported"; say what is wrong while it is clear.
	if err := flagsImplemented(s.sd, local.Caps.Flags); err != nil {
		s.sd.Close(ctx)
		return nil, toStatus(err)
	}
	s.opened = true
	s.caps = local.Caps
	if local.Caps.Flags.Has(sdi.FlagPoll) {
		s.poller = s.sd.(sdi.Poller) // flagsImplemented checked it
	}
	if local.Caps.Flags.Has(sdi.FlagIdle) {
		s.idler = s.sd.(sdi.Idler)
	}
	// The host fits the caps to its data plane the same way; records
	// beyond the fitted limits are broken on both sides.
	_, fitted := planeBytes(local.Caps)
	s.lim = limits{maxHeader: fitted.MaxHeader, maxPayload: fitted.MaxFrame, size: int(size)}
	s.down = make([]atomic.Bool, size)
	return &sdiv1.Open_Response{Addr: local.Addr, Caps: capsToProto(local.Caps)}, nil
}

func (s *server) SetJobCards(ctx context.Context, req *sdiv1.SetJobCards_Request) (*sdiv1.SetJobCards_Response, error) {
	jc, ok := s.sd.(sdi.JobCards)
	if !ok || !s.caps.Flags.Has(sdi.FlagJobCards) {
		return nil, toStatus(fmt.Errorf("sdi/plugin: job cards: %w", sdi.ErrUnsupported))
	}
	cards := make([][]byte, len(req.GetCards()))
	for i, c := range req.GetCards() {
		if c.GetPresent() {
			cards[i] = c.GetAddr()
		}
	}
	return &sdiv1.SetJobCards_Response{}, toStatus(jc.SetJobCards(ctx, cards))
}

func (s *server) Connect(ctx context.Context, req *sdiv1.Connect_Request) (*sdiv1.Connect_Response, error) {
	if err := s.sd.Connect(ctx, sdi.Rank(req.GetPeer()), req.GetAddr()); err != nil {
		return nil, toStatus(err)
	}
	if p := int(req.GetPeer()); p >= 0 && p < len(s.down) {
		s.down[p].Store(false)
	}
	return &sdiv1.Connect_Response{}, nil
}

func (s *server) Disconnect(ctx context.Context, req *sdiv1.Disconnect_Request) (*sdiv1.Disconnect_Response, error) {
	if err := s.awaitDispatched(ctx, req.GetRecords()); err != nil {
		return nil, toStatus(err)
	}
	return &sdiv1.Disconnect_Response{}, toStatus(s.sd.Disconnect(ctx, sdi.Rank(req.GetPeer())))
}

func (s *server) Flush(ctx context.Context, req *sdiv1.Flush_Request) (*sdiv1.Flush_Response, error) {
	if err := s.awaitDispatched(ctx, req.GetRecords()); err != nil {
		return nil, toStatus(err)
	}
	return &sdiv1.Flush_Response{}, toStatus(s.sd.Flush(ctx, sdi.Rank(req.GetPeer())))
}

// awaitDispatched waits until the subdevice has been handed n frame
// records. Flush is rare, so a short poll is good enough.
func (s *server) awaitDispatched(ctx context.Context, n uint64) error {
	pause := 10 * time.Microsecond
	for s.dispatched.Load() < n {
		if s.closed.Load() {
			return sdi.ErrClosed
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sdi/plugin: waiting for %d frames to reach the subdevice (%d did): %w", n, s.dispatched.Load(), ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Millisecond)
	}
	return nil
}

func (s *server) Close(ctx context.Context, _ *sdiv1.Close_Request) (*sdiv1.Close_Response, error) {
	return &sdiv1.Close_Response{}, toStatus(s.close(ctx))
}

// close closes the subdevice, then the plane. The subdevice's pending
// frames complete with ErrClosed first, which releases their ring space.
func (s *server) close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed.Swap(true) {
		s.mu.Unlock()
		return nil
	}
	close(s.closing)
	plane := s.plane
	if plane == nil {
		close(s.attached)
	}
	s.mu.Unlock()
	err := s.sd.Close(ctx)
	if plane != nil {
		plane.stop()
	}
	return err
}

// Transfer attaches the data plane and then carries it (stream plane) or
// watches it (ring plane) until the host goes away.
func (s *server) Transfer(st sdiv1.SubDevice_TransferServer) error {
	first, err := st.Recv()
	if err != nil {
		return err
	}
	att := first.GetAttach()
	if att == nil {
		return status.Error(codes.InvalidArgument, "sdi/plugin: transfer: the first message must be an attach")
	}
	s.mu.Lock()
	if !s.opened || s.plane != nil || s.closed.Load() {
		s.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "sdi/plugin: transfer: attach needs an open subdevice without a data plane")
	}
	window := int(min(att.GetWindow(), maxPlaneBytes))
	var ring *pluginRing
	var reason string
	if att.GetSegment() != "" {
		if ring, err = s.attachRing(att); err != nil {
			reason = err.Error()
			s.log.Warn("shared-memory data plane not possible, using the stream", "error", err)
		}
	}
	var stream *pluginStream
	if ring != nil {
		s.plane = ring
		if ring.aseg != nil {
			a := placeAreaAt(ring.aseg.Bytes())
			s.placer.Store(newPlacer(a, ring, placedMax(ring.seg.Bytes(), a.slotBytes, s.lim.maxPayload), ring.aseg.Reserve))
		}
	} else {
		stream = newPluginStream(st, s, s.lim, max(window, 1<<16))
		s.plane = stream
	}
	close(s.attached)
	s.mu.Unlock()

	// Only the stream plane's writer sends after this; it has nothing to
	// send until the host has read this reply and frames flow.
	if err := st.Send(&sdiv1.Transfer_Inbound{Msg: &sdiv1.Transfer_Inbound_Attached{Attached: &sdiv1.Transfer_Attached{Ring: ring != nil, Reason: reason}}}); err != nil {
		s.hostGone(err)
		return err
	}
	if stream != nil {
		err = stream.receive()
	} else {
		// The ring carries everything; the stream only tells us when the
		// host is gone.
		for err == nil {
			_, err = st.Recv()
			if err == nil {
				err = fmt.Errorf("%w: a message on the stream of a ring data plane", ErrProtocol)
			}
		}
	}
	s.hostGone(err)
	return nil
}

func (s *server) attachRing(att *sdiv1.Transfer_Attach) (*pluginRing, error) {
	seg, err := shmem.Open(att.GetSegment())
	if err != nil {
		return nil, err
	}
	if err := checkSegment(seg.Bytes(), att.GetOutBytes(), att.GetInBytes()); err != nil {
		seg.Close()
		return nil, fmt.Errorf("segment %s: %w", att.GetSegment(), err)
	}
	return newPluginRing(seg, s.openPlaceArea(seg), s, s.lim), nil
}

// openPlaceArea maps the place area the host announced in seg's header, if
// any. Without one the plugin works as well, only with a copy more per
// large payload, so a failure is a warning.
func (s *server) openPlaceArea(seg *shmem.Segment) *shmem.Segment {
	slots, slotBytes := announcedPlace(seg.Bytes())
	if slots == 0 {
		return nil
	}
	name := placeName(seg.Name())
	aseg, err := shmem.Open(name)
	if err == nil {
		err = checkPlaceArea(aseg.Bytes(), slots, slotBytes, s.lim.maxPayload)
		if err != nil {
			aseg.Close()
		}
	}
	if err != nil {
		s.log.Warn("place area not usable; large payloads take a copy more", "segment", name, "error", err)
		return nil
	}
	return aseg
}

// hostGone handles the end of the Transfer stream. After Close that is
// expected, and go-plugin's shutdown follows; before, the host died or
// broke the protocol, and the plugin has nobody to serve.
func (s *server) hostGone(err error) {
	if !s.closed.Load() {
		s.hostEnded(err)
	}
}

// hostEnded shuts the plugin down, closing the subdevice unless the host
// did: the host is gone. When the host process itself has ended, that
// holds after Close too, since a host killed between Close and go-plugin's
// shutdown never asks for the shutdown, and the plugin, in a process group
// of its own, is out of reach of the kill that ended the host.
func (s *server) hostEnded(err error) {
	if s.closed.Load() {
		s.log.Error("host went away after closing the subdevice, without shutting the plugin down; exiting", "error", err)
	} else {
		s.log.Error("host went away without closing the subdevice; shutting down", "error", err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if cerr := s.close(ctx); cerr != nil {
			s.log.Warn("close after the host went away", "error", cerr)
		}
	}
	if s.orphaned != nil {
		s.orphaned()
	}
}

// protocolError is called by a plane that read something malformed from
// the host: the data plane cannot be trusted any more.
func (s *server) protocolError(err error) {
	s.log.Error("data plane broken", "error", err)
	go s.hostGone(err)
}

// dispatchPoll bounds how long dispatch polls a subdevice that refuses a
// frame before it sleeps until a completion.
const dispatchPoll = 2 * time.Millisecond

// dispatch hands one frame record to the subdevice, retrying while it
// would block; release is called once the subdevice is done with the
// record's bytes. Frames are dispatched in record order by one goroutine.
func (s *server) dispatch(rec record, release func()) {
	defer s.dispatched.Add(1)
	s.tokMu.Lock()
	s.nextTok++
	tok := s.nextTok
	s.tokens[tok] = pendingFrame{peer: rec.peer, release: release}
	s.tokMu.Unlock()
	f := &sdi.Frame{Peer: rec.peer, Header: rec.header, Payload: rec.payload, Token: tok}
	pause := 20 * time.Microsecond
	var polled time.Time
	for {
		done, err := s.sd.Send(f)
		if errors.Is(err, sdi.ErrWouldBlock) && !s.closed.Load() {
			// A subdevice that is polled may leave its queued writes to
			// the poller, and the poller is this goroutine: poll it
			// while it refuses, for a while, then hand its progress back
			// to its own goroutines (Idle) and wait for a completion.
			if s.poller != nil {
				if polled.IsZero() {
					polled = time.Now()
				}
				if time.Since(polled) < dispatchPoll {
					s.poller.Poll()
					sched.Yield()
					continue
				}
				if s.idler != nil {
					s.idler.Idle()
				}
			}
			select {
			case <-s.kick:
			case <-time.After(pause):
				pause = min(2*pause, 5*time.Millisecond)
			case <-s.closing:
			}
			continue
		}
		if err != nil || done {
			s.finish(tok, err)
		}
		return
	}
}

// finish completes a frame: its bytes go back to the plane, and an error
// is reported to the host as the loss of the peer, since the host was told
// the frame was accepted.
func (s *server) finish(tok uint64, err error) {
	s.tokMu.Lock()
	pf, ok := s.tokens[tok]
	delete(s.tokens, tok)
	s.tokMu.Unlock()
	if !ok {
		s.log.Warn("SendDone for an unknown token", "token", tok)
		return
	}
	pf.release()
	if err != nil && !s.closed.Load() {
		s.peerDown(pf.peer, err)
	}
}

func (s *server) peerDown(peer sdi.Rank, err error) {
	if int(peer) < 0 || int(peer) >= len(s.down) || s.down[peer].Swap(true) {
		return
	}
	// The reason travels as a payload, so it obeys the payload limit.
	why := []byte(err.Error())
	s.put(kindPeerDown, peer, nil, why[:min(len(why), maxReason, s.lim.maxPayload)])
}

// maxReason bounds the text of a lost peer's reason.
const maxReason = 1024

// put sends a record to the host once the plane is attached.
func (s *server) put(kind uint8, peer sdi.Rank, header, payload []byte) {
	<-s.attached
	s.mu.Lock()
	plane := s.plane
	s.mu.Unlock()
	if plane != nil && !s.closed.Load() {
		plane.put(kind, peer, header, payload)
	}
}

// serverHandler is the Handler the plugin's subdevice sees. Deliver and
// PeerDown become records towards the host; they wait while the data plane
// is full, which pushes back on the subdevice's receive path.
type serverHandler server

func (h *serverHandler) Deliver(from sdi.Rank, header, payload []byte) {
	s := (*server)(h)
	if int(from) < 0 || int(from) >= s.lim.size {
		// The host would take the record for a broken plugin and report
		// every peer down; built in, the multidevice drops such a frame.
		s.log.Warn("dropping a frame from a rank outside the job", "from", from, "size", s.lim.size)
		return
	}
	if pl := s.placer.Load(); pl != nil && len(header) <= s.lim.maxHeader {
		slot, ok := pl.claim(from, payload)
		if !ok && len(payload) > s.lim.maxPayload && pl.carries(len(payload)) {
			// Beyond the ring, as a peer that runs the subdevice
			// built in sends them: a slot carries it.
			var err error
			if slot, err = pl.carry(from, payload, s.closing); err != nil {
				s.peerDown(from, fmt.Errorf("sdi/plugin: a frame of %d bytes from rank %d, beyond the ring, needs a place-area slot to reach the host: %w",
					len(payload), from, err))
				return
			}
			ok = true
		}
		if ok {
			if !s.closed.Load() {
				pl.ring.putPlaced(from, slot, header, len(payload))
			}
			return
		}
	}
	if len(header) > s.lim.maxHeader || len(payload) > s.lim.maxPayload {
		// The host would take the record for a broken plugin, and a
		// frame dropped without a word leaves its receive waiting.
		s.peerDown(from, s.beyondPlane(from, len(header), len(payload)))
		return
	}
	s.put(kindDeliver, from, header, payload)
}

// beyondPlane is why a frame from peer of hdr+n bytes cannot reach the
// host, naming what the plane carries and what to configure.
func (s *server) beyondPlane(from sdi.Rank, hdr, n int) error {
	carried := s.lim.maxPayload
	if pl := s.placer.Load(); pl != nil {
		carried = max(carried, min(pl.max, pl.a.slotBytes))
	}
	return fmt.Errorf("sdi/plugin: a frame of %d+%d bytes from rank %d exceeds the %d+%d bytes the plugin's data plane carries to the host "+
		"(the subdevice's own limits, which a rank running it built in uses, are %d+%d): "+
		"configure the subdevice's largest frame to at most %d bytes on every rank, or run it the same way on every rank, with shared_memory on: %w",
		hdr, n, from, s.lim.maxHeader, carried, s.caps.MaxHeader, s.caps.MaxFrame, carried, sdi.ErrTooLarge)
}

// Place implements sdi.Placer: a large payload goes into a slot of the
// place area, where the host reads it, instead of a buffer of the
// subdevice's own that Deliver would copy into the ring.
func (h *serverHandler) Place(from sdi.Rank, header []byte, n int) []byte {
	s := (*server)(h)
	pl := s.placer.Load()
	if pl == nil || len(header) > s.lim.maxHeader || int(from) < 0 || int(from) >= s.lim.size || s.closed.Load() {
		return nil
	}
	return pl.place(from, n)
}

func (h *serverHandler) SendDone(token uint64, err error) {
	s := (*server)(h)
	s.finish(token, err)
	wake(s.kick)
}

func (h *serverHandler) PeerDown(peer sdi.Rank, err error) {
	s := (*server)(h)
	if pl := s.placer.Load(); pl != nil {
		pl.end(peer)
	}
	s.peerDown(peer, err)
}

// flagsImplemented checks that sd implements the optional interfaces its
// capability flags promise.
func flagsImplemented(sd sdi.SubDevice, f sdi.Flag) error {
	if _, ok := sd.(sdi.JobCards); f.Has(sdi.FlagJobCards) && !ok {
		return fmt.Errorf("sdi/plugin: open: the subdevice declares FlagJobCards but does not implement sdi.JobCards: %w", sdi.ErrUnsupported)
	}
	if _, ok := sd.(sdi.Poller); f.Has(sdi.FlagPoll) && !ok {
		return fmt.Errorf("sdi/plugin: open: the subdevice declares FlagPoll but does not implement sdi.Poller: %w", sdi.ErrUnsupported)
	}
	if _, ok := sd.(sdi.Idler); f.Has(sdi.FlagIdle) && !ok {
		return fmt.Errorf("sdi/plugin: open: the subdevice declares FlagIdle but does not implement sdi.Idler: %w", sdi.ErrUnsupported)
	}
	if f.Has(sdi.FlagIdle) && !f.Has(sdi.FlagPoll) {
		return fmt.Errorf("sdi/plugin: open: the subdevice declares FlagIdle without FlagPoll: %w", sdi.ErrUnsupported)
	}
	return nil
}
