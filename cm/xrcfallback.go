package cm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"time"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/xrc"
)

// dialXRCPrefer dials dst over XRC on site, and reports useRC where an
// XRCPrefer Dial goes on over RC instead: the peer's CM answered that
// nothing listens for XRC on that port (peerWithoutXRC), which is what an
// RC-only listener (cm's RC listeners and most librdmacm servers listen in
// RDMA_PS_TCP; an XRC endpoint in RDMA_PS_IB and RDMA_PS_UDP), an XRC-less
// peer's XRCPrefer listener among them, makes of an XRC request. The
// reason is logged, as checkXRC's fallback logs a device's. Any other
// failure (a timeout, a reject the peer chose, the engine's own errors)
// is the Dial's, as it is with XRCRequire.
//
// The refusal is remembered for noXRCMemory: the XRCPrefer Dials from site
// to dst meanwhile go over RC at once, without the XRC request's round trip
// (a node with XRC in a mixed cluster dials its RC-only peers so, at the
// cost of one refused request per peer port and noXRCMemory). The caller
// forgets it (forgetNoXRC) where the RC dial fails: the peer may listen for
// XRC only by now, and the next Dial asks it again.
func dialXRCPrefer(ctx context.Context, dst netip.AddrPort, cfg config, site xrcSite) (c *Conn, useRC bool, err error) {
	where := site.device
	if where == "" {
		where = "in-memory fabric"
	}
	if cfg.xrc == XRCPrefer && rememberedNoXRC(site, dst) {
		cfg.logger.Debug("XRC refused by the peer's CM recently, using RC", "device", where, "remote", Addr{dst}, "remembered", noXRCMemory)
		return nil, true, nil
	}
	c, err = dialXRC(ctx, dst, cfg, site)
	if err == nil || cfg.xrc != XRCPrefer || ctx.Err() != nil {
		return c, false, err
	}
	reason := peerWithoutXRC(err)
	if reason == "" {
		return nil, false, err
	}
	rememberNoXRC(site, dst)
	cfg.logger.Info("XRC unavailable, using RC", "device", where, "remote", Addr{dst}, "reason", reason)
	return nil, true, nil
}

// noXRCMemory is how long an XRCPrefer Dial's refusal as meeting no XRC
// listener holds for later Dials from the same site to the same address.
var noXRCMemory = 30 * time.Second

// The refusals remembered, with when each stops counting.
var noXRCPeers struct {
	sync.Mutex
	m map[noXRCKey]time.Time
}

type noXRCKey struct {
	site xrcSite
	dst  netip.AddrPort
}

func rememberNoXRC(site xrcSite, dst netip.AddrPort) {
	now := time.Now()
	noXRCPeers.Lock()
	defer noXRCPeers.Unlock()
	if noXRCPeers.m == nil {
		noXRCPeers.m = map[noXRCKey]time.Time{}
	}
	if len(noXRCPeers.m) >= 1024 {
		// Bounded by the peers refused within noXRCMemory.
		maps.DeleteFunc(noXRCPeers.m, func(_ noXRCKey, until time.Time) bool { return !now.Before(until) })
	}
	noXRCPeers.m[noXRCKey{site, dst}] = now.Add(noXRCMemory)
}

func rememberedNoXRC(site xrcSite, dst netip.AddrPort) bool {
	noXRCPeers.Lock()
	defer noXRCPeers.Unlock()
	until, ok := noXRCPeers.m[noXRCKey{site, dst}]
	return ok && time.Now().Before(until)
}

func forgetNoXRC(site xrcSite, dst netip.AddrPort) {
	noXRCPeers.Lock()
	defer noXRCPeers.Unlock()
	delete(noXRCPeers.m, noXRCKey{site, dst})
}

// peerWithoutXRC says why err, a failed XRC Dial's, shows that nothing on
// the peer's port takes XRC, or "" where it does not show that. The one
// sign taken is the CM's own no-listener answer (xrc.RejectNoListener): a
// REJ with reason 8 (invalid service ID) to the physical link's XRC-typed
// REQ in RDMA_PS_IB, or a SIDR REP with status 1 (unsupported) to a
// virtual link's SIDR REQ in RDMA_PS_UDP, sent by the peer's kernel with no
// private data; the engine calls it so only when no goxrc REJECT rides it.
// Not taken: a request nobody answered (a timeout), the REJECT of an XRC
// endpoint (APP_REJECT, BUSY_RETRY, NO_XRC, ...: an XRC listener is there),
// and the CM's zero-data reason 28 (consumer defined), which an RC
// listener in RDMA_PS_IB gives an XRC REQ (a QP-type mismatch) but every
// rdma_reject without private data gives too.
func peerWithoutXRC(err error) string {
	var re *xrc.RejectError
	if !errors.As(err, &re) || re.Reason != xrc.RejectNoListener {
		return ""
	}
	// The engine says RejectNoListener for these two statuses only: REJ
	// reason 8 and SIDR status 1 (which as a REJ reason would be "no QP").
	name := rdmacm.RejectReason(re.Status).String()
	if re.Status == rdmacm.SIDRUnsupported {
		name = rdmacm.SIDRStatus(re.Status).String()
	}
	return fmt.Sprintf("no XRC listener on the peer's port (%v, CM status %d: %s): an RC-only listener, or none", re.Reason, re.Status, name)
}
