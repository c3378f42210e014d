package cm

import (
	"fmt"

	"github.com/goxrc/goxrc/verbs"
)

// A device's asynchronous events (ibv_get_async_event) are read for the life
// of the device by one goroutine, which waits for the async fd in the
// netpoller (verbs.Context.AsyncEvents acknowledges each event at once, so
// destroying a QP never waits for us). The events that concern connections:
//
//   - QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR and CQ_ERR fail the connection
//     whose QP or CQ they name, with the device's reason. The flush that
//     follows would fail it too, but only as "work request flushed".
//   - DEVICE_FATAL fails every connection on the device as a removal does
//     (ErrDeviceRemoved, and each lets go of the device at once): nothing
//     on the context works any more, and drivers that take a device away
//     from a process send it before the RDMA CM's DEVICE_REMOVAL, which
//     then finds the connection failed already.
//   - PORT_ERR and PORT_ACTIVE, when they change the port's state (taken to
//     be up at first), are logged by each connection on the port and counted
//     (ProcessStats.PortErrors). A port that goes down breaks no
//     connection by itself: a connection fails once its transport gives up
//     retrying (or its keepalive does), and survives a port that comes back
//     before then, as a TCP connection survives a cable pulled and put back.
//
// Everything else (COMM_EST, which only matters to a QP in RTR while ours go
// to RTS at once; LID, P_Key, GID and SM changes) is read and dropped.

// readAsync delivers the device's events until the context closes.
func (d *device) readAsync(events <-chan verbs.AsyncEvent) {
	defer close(d.asyncDone)
	for ev := range events {
		d.handleAsync(ev)
	}
}

func (d *device) handleAsync(ev verbs.AsyncEvent) {
	var match func(t *rdmaTransport) bool
	switch ev.Type {
	case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr:
		match = func(t *rdmaTransport) bool { return t.qp.Num() == ev.QPNum }
	case verbs.EventCQErr:
		match = func(t *rdmaTransport) bool { return t.cq == ev.CQ }
	case verbs.EventDeviceFatal:
		// An idle device has no connection to hear of it. In a goroutine:
		// removed takes devices' lock, which a device's closing holds
		// while it destroys the device's objects.
		go d.removed()
		match = func(*rdmaTransport) bool { return true }
	case verbs.EventPortErr, verbs.EventPortActive:
		match = func(t *rdmaTransport) bool { return t.port == ev.Port }
	default:
		return
	}
	d.mu.Lock()
	if ev.Type == verbs.EventPortErr || ev.Type == verbs.EventPortActive {
		// Only changes count: rxe reports a netdev coming up twice
		// (NETDEV_UP, then NETDEV_CHANGE).
		down := ev.Type == verbs.EventPortErr
		if d.portDown[ev.Port] == down {
			d.mu.Unlock()
			return
		}
		d.portDown[ev.Port] = down
		if down {
			globalStats.portErrors.Add(1)
		}
	}
	if ev.Type == verbs.EventDeviceFatal && !d.fatalLocked() {
		// With the connections it reaches taken, so that each one
		// added hears of it once: here, or from addConn. A listener
		// watches it (Listener.watchFatal).
		close(d.fatal)
	}
	var hit []*rdmaTransport
	for t := range d.conns {
		if match(t) {
			hit = append(hit, t)
		}
	}
	var dead []cachedQP
	if ev.Type == verbs.EventCQErr {
		dead = d.cqErrLocked(ev.CQ, hit)
	}
	if len(dead) > 0 {
		d.deadPairs.Add(1)
	}
	d.mu.Unlock()
	if len(dead) > 0 {
		closePairs(dead)
		d.deadPairs.Done()
	}
	// Outside the lock: a connection failing takes locks of its own. Every
	// connection hears of the event before the application's logger runs:
	// a slow handler kept those after it on a dead device.
	logs := make([]func(), 0, len(hit))
	for _, t := range hit {
		logs = append(logs, t.asyncEvent(ev))
	}
	for _, log := range logs {
		log()
	}
}

// cqErrLocked keeps a CQ in error from the next connection: a CQ in error
// takes no more completions (IBTA C11-37), and the next connection would
// wait on it for ever. The transports on it are marked here, under d.mu,
// not at delivery, which may come after free looked at the mark (putQP
// does, under d.mu, before free takes its transport off the device). A
// pair given back before the event was read is taken out of the cache and
// returned for the caller to destroy.
func (d *device) cqErrLocked(cq *verbs.CQ, on []*rdmaTransport) []cachedQP {
	for _, t := range on {
		t.cqBroken.Store(true)
	}
	var dead []cachedQP
	for s, l := range d.qps {
		kept := l[:0]
		for _, p := range l {
			if p.cq == cq {
				dead = append(dead, p)
			} else {
				kept = append(kept, p)
			}
		}
		clear(l[len(kept):])
		d.qps[s] = kept
	}
	d.cachedQPs -= len(dead)
	globalStats.cachedQPs.Add(-int64(len(dead)))
	return dead
}

// addConn makes t's connection hear the device's events about it. One
// whose handshake completed after the device reported DEVICE_FATAL hears of
// that now: the event came once, and its Sends and Recvs would wait on the
// dead device for completions that never come. Under d.mu, either
// handleAsync finds t among the connections or addConn finds the device
// failed, never neither.
func (d *device) addConn(t *rdmaTransport) {
	d.mu.Lock()
	d.conns[t] = struct{}{}
	fatal := d.fatalLocked()
	d.mu.Unlock()
	if fatal {
		t.asyncEvent(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})()
	}
}

// fatalLocked reports whether the device reported DEVICE_FATAL.
func (d *device) fatalLocked() bool {
	select {
	case <-d.fatal:
		return true
	default:
		return false
	}
}

// failed reports whether the device reported DEVICE_FATAL; a nil one, not
// yet acquired, has not.
func (d *device) failed() bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fatalLocked()
}

func (d *device) removeConn(t *rdmaTransport) {
	d.mu.Lock()
	delete(d.conns, t)
	d.mu.Unlock()
}

// asyncEvent passes an event on to the connection. An error event about the
// QP counts only while the QP is in the error state, where such an event
// always leaves it: an event read late, about a QP that a closed connection
// gave back and a new one took since (qpcache.go), finds it working and is
// dropped. It returns the writing of the event's log records (onAsync).
func (t *rdmaTransport) asyncEvent(ev verbs.AsyncEvent) (log func()) {
	if t.onAsync == nil {
		return func() {}
	}
	switch ev.Type {
	case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr:
		attr, _, err := t.qp.Query(verbs.QPAttrState)
		if err != nil || attr.State != verbs.QPStateErr {
			return func() {}
		}
	}
	return t.onAsync(ev)
}

// asyncEvent handles a device event about the connection (see the top of
// this file) and logs it.
func (c *Conn) asyncEvent(ev verbs.AsyncEvent) { c.takeAsyncEvent(ev)() }

// takeAsyncEvent is asyncEvent, but returns the writing of its log records
// (onAsync).
func (c *Conn) takeAsyncEvent(ev verbs.AsyncEvent) (log func()) {
	switch ev.Type {
	case verbs.EventPortErr:
		return func() {
			c.log("RDMA port down: the connection fails unless the port comes back before the transport's retries run out",
				"remote", c.raddr, "event", ev)
		}
	case verbs.EventPortActive:
		return func() { c.logInfo("RDMA port active", "remote", c.raddr, "event", ev) }
	case verbs.EventDeviceFatal:
		logs := c.loseDevice(fmt.Sprintf("the device reported a fatal error (%v)", ev.Type))
		return func() { c.logFailures(logs) }
	default:
		logs := c.failTaking(fmt.Errorf("%w: the RDMA device reported %v on the connection's queues", ErrPeerGone, ev.Type))
		return func() { c.logFailures(logs) }
	}
}
