package cm

import (
	"sync/atomic"
	"time"

	"github.com/goxrc/goxrc/verbs"
)

// A closed connection's queue pair and completion queue go back to their
// device for the next connection of the same shape instead of being
// destroyed: creating the CQ and the QP, and destroying them again, was a
// third of a server's CPU in a burst of set-ups (docs/benchmarks-log.md).
// A pair comes back only after the connection left the CM's time-wait (its
// QP number may be reused then, as the kernel would reuse it), reset, with
// its CQ drained. Pairs are kept while a listener holds the device (a
// server's connections come and go; a client's mostly end together).

// maxCachedQPs bounds the pairs a device keeps; more are destroyed.
const maxCachedQPs = 512

// qpCoolOff is how long a pair rests after its time-wait before reuse,
// oldest first: a REQ or REP naming the QP number while the peer's CM still
// remembers the connection is rejected as stale (IB CM reject 10). The
// peer forgets it when it enters its own time-wait, usually within
// milliseconds of ours; but when the peer sent the DREQ and our DREP was
// lost, only after sending the DREQ again. A dialer sends it again after
// two packet lifetimes and the CM response timeout: 6.1 s under Debian's
// 6.1 kernel over RoCE (lifetime 18: 2 x 1.07 s + 4.3 s), 4.6 s from 6.2
// on (lifetime 16), counted from its first DREQ, before our time-wait
// began. A second after ours ended was not enough (found by review of the
// kernel's CM); 8 s covers a time-wait of any length.
const qpCoolOff = 8 * time.Second

// qpShape is what a cached pair must match: the queue sizes asked for.
type qpShape struct {
	sendSlots, recvSlots, inline int
}

type cachedQP struct {
	qp    *verbs.QP
	cq    *verbs.CQ
	since time.Time // when it came back
}

// takeQP returns the oldest cached pair of this shape that has rested
// qpCoolOff, if the device has one.
func (d *device) takeQP(s qpShape) (cachedQP, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.qps[s]
	if len(l) == 0 || time.Since(l[0].since) < qpCoolOff {
		return cachedQP{}, false
	}
	p := l[0]
	l[0] = cachedQP{}
	d.qps[s] = l[1:]
	d.cachedQPs--
	globalStats.cachedQPs.Add(-1)
	globalStats.qpsReused.Add(1)
	return p, true
}

// putQP resets qp, drains cq and keeps the pair for the next connection of
// shape s. It reports false, keeping nothing, if no listener holds the
// device, the device holds enough, the reset fails, or the device reported
// CQ_ERR about cq (cqBroken, marked under d.mu); the caller destroys the
// pair then.
func (d *device) putQP(s qpShape, qp *verbs.QP, cq *verbs.CQ, wcs []verbs.WorkCompletion, cqBroken *atomic.Bool) bool {
	devices.Lock()
	// Only for a listener's device: a client process closing its
	// connections would reset each QP only to destroy it when the last one
	// takes the device with it.
	keep := d.listeners > 0 && d.refs > 1 && !d.gone
	devices.Unlock()
	if !keep {
		return false
	}
	d.mu.Lock()
	full := d.cachedQPs >= maxCachedQPs || d.ccErr != nil || cqBroken.Load()
	d.mu.Unlock()
	if full {
		return false
	}
	// In RESET the QP's queues are empty and it makes no more
	// completions; those of the flush before are polled out.
	if qp.Modify(&verbs.QPAttr{State: verbs.QPStateReset}, verbs.QPAttrState) != nil {
		return false
	}
	for {
		n, err := cq.Poll(wcs)
		if err != nil {
			return false
		}
		if n == 0 {
			break
		}
	}
	// Again under devices' lock: the last listener may have gone during
	// the reset, its dropQPs already run (dropListener counts it down
	// under that lock first), and a pair kept now would stay for as long
	// as the device lives without a listener.
	devices.Lock()
	defer devices.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cachedQPs >= maxCachedQPs || d.listeners == 0 || d.gone || cqBroken.Load() {
		return false
	}
	d.qps[s] = append(d.qps[s], cachedQP{qp: qp, cq: cq, since: time.Now()})
	d.cachedQPs++
	globalStats.cachedQPs.Add(1)
	return true
}

// dropQPs destroys every cached pair: the device is going, or lockable
// memory ran out (reclaimLockedMemory). It reports whether there was any.
func (d *device) dropQPs() bool {
	d.mu.Lock()
	qps, n := d.qps, d.cachedQPs
	globalStats.cachedQPs.Add(-int64(n))
	d.qps, d.cachedQPs = map[qpShape][]cachedQP{}, 0
	d.mu.Unlock()
	for _, l := range qps {
		closePairs(l)
	}
	return n > 0
}

// closePairs destroys pairs taken out of the cache.
func closePairs(l []cachedQP) {
	for _, p := range l {
		p.qp.Close()
		p.cq.Close()
	}
}
