package multidevice

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpc-multidevice/multidevice/internal/sched"
	"github.com/hpc-multidevice/multidevice/sdi"
)

// How long a waiting goroutine drives progress without anything happening
// before it parks: spinFor of back-to-back polls, then polls with a yield
// of the processor between them until spinTotal. Any frame delivered or
// sent restarts the clock, so a wait during which data flows (a window of
// large messages) keeps driving it. spinTotal is longer than the shm
// progress goroutine's nap, so that its hand-over to a parked waiter is
// rarely on a message's path, and short enough that a rank blocked on
// nothing burns a negligible share of a core (it parks after 2 ms).
const (
	spinFor   = 100 * time.Microsecond
	spinTotal = 2 * time.Millisecond
	// spinCheckEvery is how many polling rounds pass between clock reads.
	spinCheckEvery = 16
	// goschedEvery is how many yielding rounds pass between yields to
	// this process's other goroutines (every round yields the thread).
	goschedEvery = 16
)

// progressState is the Device's part of the progress model in the package
// doc: which subdevices a waiter polls, and how many waiters do.
type progressState struct {
	pollers     []*polled   // every subdevice with FlagPoll
	peerPollers [][]*polled // [peer] those among them that carry its routes
	// sched is the poll schedule of waiters with several subdevices to
	// poll (pollsched.go).
	sched schedState
	// spinners counts goroutines in spin; while there is one, queued
	// frames are sent by it and the outbox goroutine is not woken.
	spinners atomic.Int32
	reqs     sync.Pool      // *Request, for the blocking Send and Recv
	spareReq spare[Request] // tried before reqs
	// crowded is set when this host runs more polling threads than it has
	// CPUs: a waiter then yields between polls from the start, since the
	// peer it waits for may need this very core (Open MPI's
	// yield_when_idle). Every rank polls, and so does every rank's plugin
	// process for a pollable external subdevice.
	crowded bool
}

// publishCPUs tells the other ranks which CPUs this one may run on, so
// that noteHosts can tell whether the ranks of a host share CPUs. A rank
// that cannot read them publishes nothing, which reads as "unknown".
func (d *Device) publishCPUs() error {
	var b []byte
	if cpus, err := sched.Affinity(); err == nil {
		b = cpus.Encode()
	} else {
		d.log.Debug("CPUs unknown", "error", err)
	}
	if err := d.boot.Put("cpus", b); err != nil {
		return fmt.Errorf("multidevice: publish CPUs: %w", err)
	}
	return nil
}

// noteHosts records whether this rank's host is crowded, from the CPUs its
// ranks may run on; the subdevices are open by then.
func (d *Device) noteHosts(ctx context.Context, hosts []string) error {
	var local []sched.CPUSet
	mine := -1
	for r, h := range hosts {
		if h != hosts[d.rank] {
			continue
		}
		b, err := d.boot.Get(ctx, r, "cpus")
		if err != nil {
			return fmt.Errorf("multidevice: CPUs of rank %d: %w", r, err)
		}
		cpus, err := sched.DecodeCPUSet(b)
		if err != nil {
			d.log.Warn("CPUs of a rank unreadable; taken as unknown", "rank", r, "error", err)
		}
		if int32(r) == d.rank {
			mine = len(local)
		}
		local = append(local, cpus)
	}
	perRank := 1
	for _, s := range d.subs[1:] {
		if s.external && s.caps.Flags.Has(sdi.FlagPoll) {
			perRank++
		}
	}
	var pollers, ncpu int
	d.prog.crowded, pollers, ncpu = crowded(local, mine, perRank, runtime.NumCPU())
	d.log.Debug("polling threads and the CPUs they share", "threads", pollers, "cpus", ncpu, "crowded", d.prog.crowded, "mine", local[mine])
	return nil
}

// crowded reports whether more polling threads may run on this rank's CPUs
// than there are: a waiter must then yield between polls, since the peer
// it waits for may need this very core. local holds the CPUs of each rank
// on this host, this one at index mine; each runs perRank polling threads
// (itself and its external pollable subdevices, which inherit its CPUs).
// The threads counted are those of the ranks whose CPUs overlap this
// one's, on the CPUs of all of them: ranks an MPI launcher or Slurm bound
// to a core each are not crowded, however few CPUs each sees; unbound
// ranks all overlap and count against every CPU they may use. When a
// rank's CPUs are unknown, every rank of the host counts against
// hostCPUs.
func crowded(local []sched.CPUSet, mine, perRank, hostCPUs int) (yes bool, threads, cpus int) {
	if slices.ContainsFunc(local, func(s sched.CPUSet) bool { return s == nil }) {
		threads = len(local) * perRank
		return threads > hostCPUs, threads, hostCPUs
	}
	var union sched.CPUSet
	for _, s := range local {
		if s.Overlaps(local[mine]) {
			threads += perRank
			union = union.Union(s)
		}
	}
	cpus = union.Count()
	return threads > cpus, threads, cpus
}

// initPolling finds the pollable subdevices once routes are known.
func (d *Device) initPolling() error {
	bySub := make(map[int]*polled)
	for _, s := range d.subs[1:] {
		if !s.caps.Flags.Has(sdi.FlagPoll) {
			continue
		}
		p, ok := s.sd.(sdi.Poller)
		if !ok {
			return fmt.Errorf("multidevice: subdevice %q declares FlagPoll but does not implement sdi.Poller", s.name)
		}
		pp := &polled{p: p}
		if s.caps.Flags.Has(sdi.FlagIdle) {
			if pp.idler, ok = s.sd.(sdi.Idler); !ok {
				return fmt.Errorf("multidevice: subdevice %q declares FlagIdle but does not implement sdi.Idler", s.name)
			}
		}
		bySub[s.idx] = pp
		d.prog.pollers = append(d.prog.pollers, pp)
	}
	d.prog.peerPollers = make([][]*polled, d.size)
	for peer, classes := range d.routes {
		seen := map[int]bool{}
		idxs := append([]int(nil), classes...)
		for _, trunks := range d.fwd.paths[peer] { // the first hops of indirect routes
			for _, t := range trunks {
				idxs = append(idxs, t.sub.idx)
			}
		}
		for _, idx := range idxs {
			if p, ok := bySub[idx]; ok && !seen[idx] {
				seen[idx] = true
				d.prog.peerPollers[peer] = append(d.prog.peerPollers[peer], p)
			}
		}
	}
	return nil
}

// spin drives progress on the calling goroutine until done reports true
// (it returns true) or the spin budget is spent (false). It polls the given
// subdevices, on the schedule of pollsched.go, and sends what the outbox
// holds; with nothing to poll it returns at once and the caller parks.
func (d *Device) spin(pollers []*polled, done func() bool) bool {
	if len(pollers) == 0 {
		return done()
	}
	var sch schedule
	sch.load(&d.prog.sched, pollers, d.prog.crowded)
	// Most waits on a busy link end in the first round: it runs here
	// rather than in rounds, which made a wait that ends in it cost ~15 ns
	// more (BenchmarkSendRecvOneGoroutine).
	if _, ok := d.round(pollers, &sch, done); ok {
		sch.save()
		return true
	}
	var spinner bool
	ok := d.rounds(pollers, &sch, done, &spinner)
	sch.save()
	if spinner {
		d.stopSpinning()
	}
	return ok
}

// pollOne is the start of a wait for r when one subdevice can complete
// it and the host is not crowded, which is a ping-pong's every wait:
// spin's first spinCheckEvery rounds, polling the subdevice straight,
// without spin's schedule, round's calls and the call through done. It
// reports whether r completed; if not, spin takes over.
func (d *Device) pollOne(r *Request) bool {
	pollers := r.pollers()
	if len(pollers) != 1 || d.prog.crowded {
		return false
	}
	p := pollers[0].p
	for range spinCheckEvery {
		p.Poll()
		d.out.help() // what the handlers queued in reply, as round sends it
		// Whatever the poll handled: another goroutine (a second waiter's
		// poll, the subdevice's own progress) may have completed r.
		if r.isDone() {
			return true
		}
	}
	return false
}

// rounds is spin's loop after the first round. This goroutine counts as
// a spinner (*spinner set) only once the loop ran spinCheckEvery rounds
// or one of them handled something: most waits on a busy link, a small
// message's ping-pong among them, end before either, and counting costs
// two locked instructions, one of them between the arrival and the
// caller's next step. A frame a handler queues before that wakes the
// outbox goroutine, and is sent here anyway if that one is not at it.
func (d *Device) rounds(pollers []*polled, sch *schedule, done func() bool, spinner *bool) bool {
	var start time.Time
	yield := d.prog.crowded
	for i := 0; ; i++ {
		n, ok := d.round(pollers, sch, done)
		if ok {
			return true
		}
		if !*spinner && (n > 0 || i%spinCheckEvery == spinCheckEvery-1) {
			d.prog.spinners.Add(1)
			*spinner = true
		}
		if n > 0 && !start.IsZero() {
			start, yield = time.Time{}, d.prog.crowded // restart the clock at the next check
			sch.yielding(yield)
		}
		if yield {
			// runtime.Gosched puts this goroutine on the global run queue
			// and, with a processor idle, wakes another thread to look
			// for work: a futex wake-up and one more runnable thread on
			// a crowded host, every round. This process's other
			// goroutines get a processor of their own when they become
			// runnable, so it is needed only when every processor
			// spins: every goschedEvery-th yield is enough for that.
			if i%goschedEvery == goschedEvery-1 {
				runtime.Gosched()
			}
			sched.Yield()
		}
		// The clock is read only once a wait lasts a few rounds: most
		// waits on a busy link end before that.
		if i%spinCheckEvery == spinCheckEvery-1 {
			if start.IsZero() {
				start = time.Now()
				continue
			}
			el := time.Since(start)
			if el > spinTotal {
				d.idle(pollers)
				return false
			}
			if !yield && el > spinFor {
				yield = true
				sch.yielding(true)
			}
		}
	}
}

// round polls each subdevice the schedule has due once and sends what
// the outbox holds. It returns how many frames and completions that
// handled, and whether done became true, which it checks after every
// poll that handled something: once a message has come in through one
// subdevice, its waiter does not first wait for the others' polls.
func (d *Device) round(pollers []*polled, sch *schedule, done func() bool) (int, bool) {
	n := 0
	sch.tick()
	for i, pp := range pollers {
		var k int
		switch {
		case sch.st == nil: // sch.poll's first case, without the call
			k = pp.p.Poll()
		case sch.due(i):
			k = sch.poll(i)
		default:
			continue
		}
		if k > 0 {
			n += k
			if done() {
				d.out.help()
				return n, true
			}
		}
	}
	n += d.out.help() // what the handlers queued in reply
	return n, done()
}

// idle tells the pollers that stand by while polled that this waiter
// parks, so that their own progress takes over at once.
func (d *Device) idle(pollers []*polled) {
	for _, pp := range pollers {
		if pp.idler != nil {
			pp.idler.Idle()
		}
	}
}

// stopSpinning ends a spin. If frames are queued, the outbox goroutine
// takes over; push skipped waking it while this goroutine was sending.
func (d *Device) stopSpinning() {
	d.prog.spinners.Add(-1)
	if d.out.queued.Load() > 0 {
		d.out.kick()
	}
}

// getRequest returns a fresh request from the pool.
func (d *Device) getRequest(send bool, peer int32) *Request {
	r := d.prog.spareReq.take()
	if r == nil {
		r, _ = d.prog.reqs.Get().(*Request)
	}
	if r == nil {
		rf := new(struct {
			r  Request
			of outFrame
		})
		d.initRequest(&rf.r, send, peer)
		rf.r.of = &rf.of
		return &rf.r
	}
	// Reset here rather than in putRequest: a blocking call's return (a
	// Recv whose reply the caller sends next) is on a message's path; the
	// start of the next call mostly is not.
	r.reset()
	r.send, r.peer = send, peer
	return r
}

// putRequest gives r back to the pool if nothing else can reach it any more.
func (d *Device) putRequest(r *Request) {
	if r.reusable() && !d.prog.spareReq.give(r) {
		d.prog.reqs.Put(r)
	}
}

// Send sends buf to world rank dst and returns when buf may be reused (with
// sync set: when the receiver matched it). It is Isend plus Wait without a
// request the caller could keep, so the request is recycled.
//
// When ctx ends first Send returns its error, and buf is the caller's
// again, but the message is not taken back: it may still be received, as
// buf held it at the call. An eager message goes from a copy, taken up
// front when ctx can end at all (it may wait in queues for as long as the
// peer does not take it, and a synchronous one for the match), except on
// a line (gateways, failover), which copies it as it admits it: there one
// still waiting for credit when ctx ends takes a copy then; a rendezvous
// message whose receiver has not asked for its data yet takes a copy
// then; data the receiver asked for, already under way, is waited for.
func (d *Device) Send(ctx context.Context, buf []byte, dst, tag int, context uint64, sync bool) error {
	if !sync {
		if handled, err := d.sendNow(ctx, buf, dst, tag, context); handled {
			return err
		}
	}
	copied, lined := false, false
	if ctx.Done() != nil && d.sendsEager(dst, len(buf)) {
		if d.matchSub[dst] < 0 && d.indirect(int32(dst), d.table.Class(len(buf))) {
			// A line (gateways, failover) copies the frame into its
			// block as it admits it, and only a frame still waiting for
			// credit holds buf (copyWaiting). A copy up front as well
			// cost a failover line 1.5 times its latency at 4 KiB and 2.8
			// at 64 KiB.
			lined = true
		} else {
			buf, copied = slices.Clone(buf), true
		}
	}
	r, err := d.isend(d.getRequest(true, int32(dst)), buf, dst, tag, context, sync)
	if err != nil {
		return err
	}
	if _, err = r.Wait(ctx); err != nil && !r.isDone() && !copied {
		if lined {
			d.copyWaiting(int32(dst), r)
		} else {
			d.giveBackBuf(r)
		}
	}
	d.putRequest(r)
	return err
}

// sendsEager reports whether isend sends n bytes to dst in one frame, from
// the caller's buffer until the frame is done: eagerly, or through a
// subdevice that matches on its own, which keeps the buffer until its
// SendDone (for a synchronous message, until the match). The eager test
// is isend's, which writes it out: a helper shared with it is too big to
// inline on Isend's path.
func (d *Device) sendsEager(dst, n int) bool {
	if uint(dst) >= uint(d.appSize) {
		return false
	}
	if d.matchSub[dst] >= 0 {
		return true
	}
	class := d.table.Class(n)
	return n <= d.eagerMax(int32(dst), class, d.subs[d.routes[dst][class]])
}

// giveBackBuf returns once nothing reads the buffer of r, a rendezvous send
// (or sendNow's frame that its subdevice kept) whose caller's ctx ended. A
// rendezvous send still waiting for its clear-to-send takes a copy, which
// onCTS (under d.mu too) sends from; otherwise its data is under way to a
// receiver that matched it, or the subdevice holds the frame, and the
// subdevice completes or fails those frames.
func (d *Device) giveBackBuf(r *Request) {
	d.mu.Lock()
	if r.id != 0 && d.rndvSend[r.id] == r {
		r.buf = slices.Clone(r.buf)
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	for !r.isDone() {
		if !d.spin(r.pollers(), r.isDone) {
			// Nobody need poll for it: the subdevices' own goroutines
			// and the outbox's finish what is under way.
			time.Sleep(time.Millisecond)
		}
	}
}

// Recv receives one message into buf, as Irecv plus Wait. When ctx ends
// first the receive is cancelled or given up (waitRecv).
func (d *Device) Recv(ctx context.Context, buf []byte, src, tag int, context uint64) (Status, error) {
	r, err := d.irecv(d.getRequest(false, int32(src)), buf, src, tag, context)
	if err != nil {
		return Status{}, err
	}
	return d.waitRecv(ctx, r)
}

// waitRecv waits for r, a receive from getRequest, and recycles it. When
// ctx ends first r is cancelled; if it matched meanwhile it completes and
// its result is returned. If it matched a large message whose data is
// still coming it is given up, and if a subdevice is writing a message
// into its buffer (sdi.Placer, or one that matches on its own and has
// matched it, sdi.FlagMatching) that write is waited for: the caller has
// its buffer back, and nothing is written into it after waitRecv
// returns.
func (d *Device) waitRecv(ctx context.Context, r *Request) (Status, error) {
	// r.Wait and putRequest, spelled out: on a message's way from its
	// arrival to the caller's reply, their calls (putRequest is too big
	// to inline) cost 1-4 % of 8-byte latency.
	if r.isDone() || d.pollOne(r) || d.spin(r.pollers(), r.isDone) {
		st, err := r.status, r.err
		if r.reusable() && !d.prog.spareReq.give(r) {
			d.prog.reqs.Put(r)
		}
		return st, err
	}
	st, err := r.park(ctx)
	// Not !r.isDone(): r may have matched since park gave up on ctx, and
	// returning ctx's error then would lose its message.
	if err != nil && ctx.Err() != nil {
		d.Abandon(r, err)
		switch {
		case !r.isDone():
		case r.status.Cancelled: // its status says so, not rank 0's tag 0
			st = r.status
		default: // it matched after all, or was given up matched
			st, err = r.status, r.err
		}
	}
	d.putRequest(r)
	return st, err
}

// Abandon gives up r, a receive whose caller no longer wants it (its ctx
// ended, or the call it belongs to failed), with err: it is cancelled if
// it has not matched, and if it matched a large message whose data is
// still coming, the rest of that data is dropped. Abandon returns once
// nothing writes into r's buffer any more, with r complete: cancelled,
// failed with err, or with its own result if it finished meanwhile.
func (d *Device) Abandon(r *Request, err error) {
	d.Cancel(r)
	// What still writes into the buffer ends soon: a copy, a placement
	// its subdevice ends by delivering it or losing the peer, or a
	// matching subdevice's fill, which its Done ends (the device
	// completes those a closed subdevice holds).
	if !r.isDone() {
		d.abandonRecv(r, err)
		r.Result() // not <-r.Done(): closed a moment before r counts as done
	}
}

// Sendrecv sends sbuf to world rank dst with stag and receives into rbuf
// from src (or AnySource) with rtag, both at once: the receive is posted
// before the send starts, so two ranks that exchange with each other (or
// a ring of them) never wait for each other. It returns when both are
// done, with the receive's status. A send that fails cancels the receive;
// one refused for its arguments is refused before the receive is posted.
func (d *Device) Sendrecv(ctx context.Context, sbuf []byte, dst, stag int, rbuf []byte, src, rtag int, cid uint64) (Status, error) {
	// Checked before the receive is posted: a posted receive may match a
	// waiting message at once, which the call would then take under the
	// send's error (a large one matched, given up, and lost).
	if dst < 0 || dst >= d.appSize {
		return Status{}, fmt.Errorf("send: %w: destination %d not in [0,%d)", ErrRank, dst, d.appSize)
	}
	if stag < 0 || stag > maxTag {
		return Status{}, fmt.Errorf("send: %w: %d (tags are 0..%d)", ErrTag, stag, maxTag)
	}
	r, err := d.irecv(d.getRequest(false, int32(src)), rbuf, src, rtag, cid)
	if err != nil {
		return Status{}, err
	}
	if err := d.Send(ctx, sbuf, dst, stag, cid, false); err != nil {
		ended, cancel := context.WithCancel(ctx)
		cancel() // the receive ends now: cancelled, unless it matched
		st, _ := d.waitRecv(ended, r)
		return st, fmt.Errorf("send: %w", err)
	}
	st, err := d.waitRecv(ctx, r)
	if err != nil {
		return st, fmt.Errorf("receive: %w", err)
	}
	return st, nil
}

// Progress drives progress on the calling goroutine, polling every
// pollable subdevice, until done reports true or the spin budget is spent;
// it reports whether done became true. Callers that wait for something
// other than one request (WaitAny, Probe) call it before parking on
// Changed. done must not block; it is called after every polling round.
func (d *Device) Progress(done func() bool) bool { return d.spin(d.prog.pollers, done) }

// IsendRequest is Isend into r, a Request the caller owns: the zero value,
// or one whose earlier operation completed, which it then reuses. A layer
// above embeds the request in its own, and a caller that reuses its
// requests (a window of them) sends without allocating. A request that is
// still in use yields ErrRequestBusy and is left as it was.
func (d *Device) IsendRequest(r *Request, buf []byte, dst, tag int, context uint64, sync bool) error {
	if err := d.reuseRequest(r, true, int32(dst)); err != nil {
		return err
	}
	if _, err := d.isend(r, buf, dst, tag, context, sync); err != nil {
		r.unstart()
		return err
	}
	return nil
}

// IrecvRequest is Irecv into r, a Request the caller owns; see
// IsendRequest.
func (d *Device) IrecvRequest(r *Request, buf []byte, src, tag int, context uint64) error {
	if err := d.reuseRequest(r, false, int32(src)); err != nil {
		return err
	}
	if _, err := d.irecv(r, buf, src, tag, context); err != nil {
		r.unstart()
		return err
	}
	return nil
}

// unstart makes r, whose operation failed to start (nothing of it was
// queued, posted or sent), a zero request again, so that it can be reused.
func (r *Request) unstart() {
	if r.pending.Load() != 0 {
		r.pending.Store(0)
	}
	r.reset()
	r.d = nil
}

// reuseRequest readies r, zero or done with its previous operation, for a
// new one.
func (d *Device) reuseRequest(r *Request, send bool, peer int32) error {
	if r.d != nil {
		if !r.reusable() {
			return ErrRequestBusy
		}
		if send {
			r.rearm() // isend arms it if it does not complete at once
			if r.of == nil {
				r.of = ownFrame()
			}
		} else {
			r.reset()
		}
	}
	d.initRequest(r, send, peer)
	return nil
}

func (d *Device) initRequest(r *Request, send bool, peer int32) {
	r.d, r.send, r.peer, r.atSub = d, send, peer, -1
}
