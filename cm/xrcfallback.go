package cm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

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
func dialXRCPrefer(ctx context.Context, dst netip.AddrPort, cfg config, site xrcSite) (c *Conn, useRC bool, err error) {
	c, err = dialXRC(ctx, dst, cfg, site)
	if err == nil || cfg.xrc != XRCPrefer || ctx.Err() != nil {
		return c, false, err
	}
	reason := peerWithoutXRC(err)
	if reason == "" {
		return nil, false, err
	}
	where := site.device
	if where == "" {
		where = "in-memory fabric"
	}
	cfg.logger.Info("XRC unavailable, using RC", "device", where, "remote", Addr{dst}, "reason", reason)
	return nil, true, nil
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
	return fmt.Sprintf("no XRC listener on the peer's port (%v, CM status %d): an RC-only listener, or none", re.Reason, re.Status)
}
