package cm

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// The endpoints of XRC listeners, by site and bound address. A closed
// listener's endpoint stays while its accepted connections do: their peers
// move and recover their legs through its port. A Listen on that address
// with the same options takes the endpoint over and accepts on it again, as
// a TCP server that closes its listener and listens again on the port keeps
// its connections (a restart after http.Server.Shutdown, say).
var xrcListeners struct {
	sync.Mutex
	m map[xrcListenKey]*xrcListen
}

type xrcListenKey struct {
	fabric *memfabric.Process
	device string
	addr   netip.AddrPort
}

// xrcListen is one listener endpoint and its references: the Listener
// accepting on it, until Close, and each connection it accepted.
type xrcListen struct {
	key xrcListenKey
	xc  xrc.Config // as the Listen that opened it asked, port included
	ep  *xrc.Endpoint
	// Under xrcListeners: refs; listening, while a Listener accepts on
	// ep; closed, made when refs reach 0 and closed once ep is.
	refs      int
	listening bool
	closed    chan struct{}
}

// openXRCListen returns the listener endpoint for xc on site (an open one no
// Listener accepts on, taken over where takeOver, or a new one) and the new
// Listener's accepting term on it. A Listen that asked for port 0 takes
// nothing over: an endpoint on the number it was given is another
// listener's, and binding fails as taken.
func openXRCListen(ctx context.Context, xc xrc.Config, site xrcSite, port uint16, takeOver bool) (*xrcListen, xrc.AcceptTerm, error) {
	key := xrcListenKey{fabric: site.fabric, device: site.device, addr: netip.AddrPortFrom(site.local, port)}
	for port != 0 && takeOver {
		xrcListeners.Lock()
		xl := xrcListeners.m[key]
		switch {
		case xl != nil && xl.closed != nil:
			// Its last connection is closing it (its Err says closed
			// already, its port is still bound): wait, then bind anew.
			closed := xl.closed
			xrcListeners.Unlock()
			select {
			case <-closed:
				continue
			case <-ctx.Done():
				return nil, xrc.AcceptTerm{}, ctx.Err()
			}
		case xl == nil || xl.listening || xl.ep.Err() != nil:
			// None, or one a Listener has (the new endpoint's bind
			// fails with EADDRINUSE), or a dead one (its port may be
			// free; a new endpoint tries).
			xrcListeners.Unlock()
		case xl.xc != xc:
			xrcListeners.Unlock()
			return nil, xrc.AcceptTerm{}, fmt.Errorf("%w: the connections of a closed listener with other options (message size, queue depth, domain or handshake timeout) hold it", syscall.EADDRINUSE)
		default:
			term := xl.ep.ResumeAccepting()
			xl.refs++
			xl.listening = true
			xrcListeners.Unlock()
			return xl, term, nil
		}
		break
	}
	ep, err := newEndpoint(ctx, xc)
	if err != nil {
		return nil, xrc.AcceptTerm{}, err
	}
	key.addr = netip.AddrPortFrom(site.local, ep.Addr().Port())
	xl := &xrcListen{key: key, xc: xc, ep: ep, refs: 1, listening: true}
	xl.xc.Addr = key.addr.String() // what a Listen on the chosen port asks
	xrcListeners.Lock()
	if xrcListeners.m == nil {
		xrcListeners.m = map[xrcListenKey]*xrcListen{}
	}
	xrcListeners.m[key] = xl // in place of a dead one
	xrcListeners.Unlock()
	return xl, ep.Term(), nil
}

// stopListening is a Listener's Close: the endpoint refuses new
// connections, and its reference goes.
func (xl *xrcListen) stopListening() error {
	xrcListeners.Lock()
	xl.listening = false
	// Under the lock: a Listen taking the endpoint over resumes it after.
	xl.ep.StopAccepting()
	xrcListeners.Unlock()
	return xl.release()
}

// acquire takes a reference for a connection an Accept is about to take.
// It reports false once the last reference went (an Accept that raced its
// Listener's Close): the endpoint is closing.
func (xl *xrcListen) acquire() bool {
	xrcListeners.Lock()
	defer xrcListeners.Unlock()
	if xl.closed != nil {
		return false
	}
	xl.refs++
	return true
}

// release drops a reference, closing the endpoint with the last.
func (xl *xrcListen) release() error {
	xrcListeners.Lock()
	xl.refs--
	if xl.refs > 0 {
		xrcListeners.Unlock()
		return nil
	}
	closed := make(chan struct{})
	xl.closed = closed
	xrcListeners.Unlock()
	// Outside the lock: Close waits up to a second for FINs.
	err := closeEndpoint(xl.ep)
	xrcListeners.Lock()
	if xrcListeners.m[xl.key] == xl {
		delete(xrcListeners.m, xl.key)
	}
	close(closed)
	xrcListeners.Unlock()
	return engineErr(err)
}
