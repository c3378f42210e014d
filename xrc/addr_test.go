package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// linkLocalCM is the kernel as kcm and rdmacm present it on a link-local
// IPv6 link: the CM reports a link-local peer with the zone of its
// interface (rdmacm's fillScope/withZone: "fe80::1%lo"), the destination
// of a connect goes out as address plus scope id, and QueryQP's peer comes
// from the path's DGID, a bare 16-byte GID without a zone (real.QueryQP).
type linkLocalCM struct{ kernel.Kernel }

func zoned(a netip.AddrPort) netip.AddrPort {
	if a.Addr().Is6() && a.Addr().IsLinkLocalUnicast() && a.Addr().Zone() == "" {
		return netip.AddrPortFrom(a.Addr().WithZone("lo"), a.Port())
	}
	return a
}

func (k linkLocalCM) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	return k.Kernel.Connect(ctx, netip.AddrPortFrom(dst.Addr().WithZone(""), dst.Port()), ex, qpn, pd)
}

func (k linkLocalCM) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	ev.Remote = zoned(ev.Remote)
	return ev, err
}

// Two processes of a node receiving from one sender share its TGT (the
// second registers on it by number), also between link-local IPv6 nodes:
// the acceptor's check that the TGT is the sender's compares the CM's
// (zoned) peer address with QueryQP's (unzoned) one. They differed, so the
// second process refused the sender's TGT for ever (TGT_GONE, the sender
// rebuilt its uplink, and the dial ran out of time).
func TestAddrLinkLocalReceiversShareTheTGT(t *testing.T) {
	w := newWorld(t)
	wrap := func(k kernel.Kernel) kernel.Kernel { return linkLocalCM{k} }
	at := func(ip string, port int) func(*Config) {
		return func(c *Config) { c.Addr = fmt.Sprintf("[%s]:%d", ip, port) }
	}
	a := w.wrappedEndpoint("fe80::1", 7000, wrap, at("fe80::1", 7000))
	b1 := w.wrappedEndpoint("fe80::2", 7000, wrap, at("fe80::2", 7000))
	b2 := w.wrappedEndpoint("fe80::2", 7001, wrap, at("fe80::2", 7001))
	for _, b := range []*proc{b1, b2} {
		go func() {
			for {
				c, err := b.Accept(ctxT(t, 30*time.Second))
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
	}
	for _, port := range []int{7000, 7001} {
		c, err := a.Dial(ctxT(t, 20*time.Second), fmt.Sprintf("[fe80::2%%lo]:%d", port))
		if err != nil {
			t.Fatalf("dial port %d: %v", port, err)
		}
		defer c.Close()
	}
	if s := w.f.Node("fe80::2").Stats(); s.TGTs != 1 || s.TGTHandles != 2 {
		t.Errorf("receiving node: %d TGTs with %d handles, want 1 TGT shared by both processes (2 handles)", s.TGTs, s.TGTHandles)
	}
	if s := w.f.Node("fe80::1").Stats(); s.INIs != 1 {
		t.Errorf("sending node: %d INIs, want 1 uplink to the node", s.INIs)
	}
}

// linkLocalCMZonedQuery is linkLocalCM whose QueryQP reports the zone too.
type linkLocalCMZonedQuery struct{ linkLocalCM }

func (k linkLocalCMZonedQuery) QueryQP(q kernel.QP) (kernel.QPInfo, error) {
	i, err := k.linkLocalCM.QueryQP(q)
	if i.Remote.IsLinkLocalUnicast() {
		i.Remote = i.Remote.WithZone("lo")
	}
	return i, err
}

// A link-local peer dialed with its zone as an interface index ("%1"), as
// package net and rdmacm's scopeID accept, is the same peer the CM later
// reports by the interface's name ("%lo"): the reverse leg must be taken.
func TestAddrLinkLocalDialByZoneIndex(t *testing.T) {
	w := newWorld(t)
	wrap := func(k kernel.Kernel) kernel.Kernel { return linkLocalCMZonedQuery{linkLocalCM{k}} }
	a := w.wrappedEndpoint("fe80::1", 7000, wrap, func(c *Config) { c.Addr = "[fe80::1]:7000" })
	b := w.wrappedEndpoint("fe80::2", 7000, wrap, func(c *Config) { c.Addr = "[fe80::2]:7000" })
	go func() {
		c, err := b.Accept(ctxT(t, 5*time.Second))
		if err == nil {
			defer c.Close()
		}
	}()
	c, err := a.Dial(ctxT(t, 5*time.Second), "[fe80::2%1]:7000") // lo's index
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close()
}

// rdmacmForms is the kernel as the real CM presents it: an IPv4-mapped
// destination goes out as AF_INET (rdmacm's toC), so the model, like the
// kernel, sees the IPv4 address.
type rdmacmForms struct{ kernel.Kernel }

func (k rdmacmForms) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	return k.Kernel.Connect(ctx, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()), ex, qpn, pd)
}

// Dialing a peer by its IPv4-mapped IPv6 form ("[::ffff:10.0.0.2]:7000",
// what netip.ParseAddrPort accepts and the CM connects to as AF_INET) must
// work like dialing "10.0.0.2:7000": the peer's reverse leg comes from the
// CM as 10.0.0.2 and must match the dial.
func TestAddrDialIPv4MappedPeer(t *testing.T) {
	w := newWorld(t)
	wrap := func(k kernel.Kernel) kernel.Kernel { return rdmacmForms{k} }
	a := w.wrappedEndpoint("10.0.0.1", 7000, wrap)
	b := w.wrappedEndpoint("10.0.0.2", 7000, wrap)
	go func() {
		c, err := b.Accept(ctxT(t, 5*time.Second))
		if err == nil {
			c.Close()
		}
	}()
	c, err := a.Dial(ctxT(t, 5*time.Second), "[::ffff:10.0.0.2]:7000")
	if err != nil {
		t.Fatalf("dial by the IPv4-mapped form: %v", err)
	}
	c.Close()
}

func TestAddrSameNode(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"10.0.0.1", "10.0.0.1", true},
		{"10.0.0.1", "::ffff:10.0.0.1", true},
		{"10.0.0.1", "10.0.0.2", false},
		{"fe80::1%lo", "fe80::1", true},   // QueryQP's DGID has no zone
		{"fe80::1%lo", "fe80::1%1", true}, // lo is index 1 on Linux
		{"fe80::1%lo", "fe80::1%nosuchif", false},
		{"fe80::1%lo", "fe80::2%lo", false},
	} {
		if got := sameNode(netip.MustParseAddr(c.a), netip.MustParseAddr(c.b)); got != c.same {
			t.Errorf("sameNode(%s, %s) = %v, want %v", c.a, c.b, got, c.same)
		}
	}
}

// Config.Addr in the IPv6-mapped form names the node's IPv4 address, as
// on a device (it failed with EADDRNOTAVAIL on a fabric process).
func TestAddrEndpointOnMappedAddr(t *testing.T) {
	w := newWorld(t)
	e := w.endpoint("10.0.0.7", 7000, func(c *Config) { c.Addr = "[::ffff:10.0.0.7]:7000" })
	if got := e.Addr().String(); got != "10.0.0.7:7000" {
		t.Fatalf("Addr %s, want 10.0.0.7:7000", got)
	}
}
