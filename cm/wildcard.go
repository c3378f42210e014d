package cm

import (
	"context"
	"net/netip"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// A listener on an unspecified address serves whichever device a request
// comes in on. It holds each such device from the first connection it
// accepts there until Close, as a listener on a device's address holds its
// one device: the context, protection domain and pooled buffers stay open
// between connections, and closed connections' QPs are kept for the next.
//
// Holding verbs objects on a device takes a CM id on it too: librdmacm
// closes a removed device's context with the last id on it, and only an id
// on the device hears of its removal (the kernel drops a wildcard
// listener's per-device ids silently). So the listener binds an id of its
// own to each device it holds (an ephemeral port of the connection's local
// address, as a Dial takes), lets go of the device on that id's
// DEVICE_REMOVAL or the device's DEVICE_FATAL (async.go), and closes the id
// after everything on the device is released.

// holdDevice makes a wildcard listener hold d, the device of a connection it
// accepts at local. Without an id bound to the device it holds nothing.
func (l *Listener) holdDevice(d *device, local netip.Addr) {
	if l.dev != nil {
		return
	}
	// Logged after heldMu is released: the logger is the application's.
	if msg, err := l.holdDeviceLocked(d, local); msg != "" {
		l.cfg.logger.Debug(msg, "device", d.name, "err", err)
	}
}

// holdDeviceLocked is holdDevice under heldMu; it returns why it could not
// hold d, to be logged.
func (l *Listener) holdDeviceLocked(d *device, local netip.Addr) (string, error) {
	l.heldMu.Lock()
	defer l.heldMu.Unlock()
	if _, ok := l.held[d]; ok || l.heldClosed {
		return "", nil
	}
	// Its ephemeral port is taken as a Dial's is (the IPoIB port space,
	// which nothing else binds in, does not bind on soft-RoCE).
	id, err := l.ch.ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	if err != nil {
		return "wildcard listener: no id to hold the device", err
	}
	if err := id.Bind(netip.AddrPortFrom(local, 0)); err != nil || id.DeviceName() != d.name || !d.holdForListener() {
		id.Close()
		return "wildcard listener: cannot hold the device", err
	}
	if l.held == nil {
		l.held = map[*device]*rdmacm.ID{}
	}
	l.held[d] = id
	l.heldWG.Go(func() { l.watchHeld(d, id) })
	return "", nil
}

// watchHeld lets go of d when its id hears of the device's removal, or
// (watchHeldFatal) the device reports DEVICE_FATAL; it ends when the id is
// closed.
func (l *Listener) watchHeld(d *device, id *rdmacm.ID) {
	ended := make(chan struct{})
	defer close(ended)
	l.heldWG.Go(func() { l.watchHeldFatal(d, id, ended) })
	for {
		ev, err := id.Event(context.Background())
		if err != nil {
			return
		}
		if ev.Type != rdmacm.EventDeviceRemoval {
			continue
		}
		l.letGoHeld(d, id)
		return
	}
}

// watchHeldFatal lets go of d when it reports DEVICE_FATAL, which a failed
// device need not follow with the CM's DEVICE_REMOVAL (as Listener.watchFatal
// closes a listener on a device's address): the listener held the dead
// device, its memory and its ids until Close. It ends with watchHeld
// (ended), not with Close: a device let go of on its removal leaves no
// goroutine behind while the listener goes on.
func (l *Listener) watchHeldFatal(d *device, id *rdmacm.ID, ended <-chan struct{}) {
	select {
	case <-d.fatal:
		l.letGoHeld(d, id)
	case <-ended:
	}
}

// letGoHeld lets go of d, held with id, unless a removal, a failure or Close
// let go of it already.
func (l *Listener) letGoHeld(d *device, id *rdmacm.ID) {
	l.heldMu.Lock()
	mine := l.held[d] == id
	if mine {
		d.removed() // before a holdDevice could see it again
		delete(l.held, d)
	}
	l.heldMu.Unlock()
	if mine {
		d.dropListener()
		id.Close() // the last: nothing of ours is left on the device
	}
}

// dropHeldDevices lets go of every device the listener holds, at Close.
func (l *Listener) dropHeldDevices() {
	l.heldMu.Lock()
	held := l.held
	l.held, l.heldClosed = nil, true
	l.heldMu.Unlock()
	for d, id := range held {
		if id.DeviceRemoved() { // a removal its watcher has not taken yet
			d.removed()
		}
		d.dropListener()
		id.Close()
	}
	l.heldWG.Wait()
}
