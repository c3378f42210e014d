package xrc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// addrDomain is what p has learned of the domain of the process at addr's
// address (0: nothing).
func addrDomain(p *proc, addr *proc) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.domainOfLocked(addr.Addr())
}

// The process at an address is replaced by one in another domain (another
// DomainDir) while the acceptor keeps its uplink into the old domain for
// another process of that node. The acceptor's learned domain for the
// address still names the old one, so its one-exchange ACCEPT puts the
// reverse leg into that domain, and the new process refuses it. That was
// errBadReverse, which Dial does not retry, and nothing else ever corrected
// the acceptor: every dial from the new process failed, for as long as the
// old uplink lived. Now Dial asks again by two exchanges; the acceptor's
// reciprocal request, refused DOMAIN_MISMATCH, re-keys the address, and the
// dials after it take one exchange into the right domain.
func TestDomainRelearnedAfterAddressReused(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.61.1", 7000)
	a2 := w.endpoint("10.0.61.1", 7001)
	k1 := w.endpoint("10.0.61.2", 7002)
	p1 := w.endpoint("10.0.61.2", 7000)
	_, toP1 := pair(t, p1, a) // a's reciprocal leg to p1 makes a's uplink into p1's domain (PHYS), and learns it
	kc, ka := pair(t, k1, a)
	// k1's connection keeps a's uplink into the old domain up after p1 goes.
	if got := addrDomain(a, p1); got != p1.dom.ID {
		t.Fatalf("setup: a learned %#x for p1's address, want %#x", got, p1.dom.ID)
	}
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}
	// a answers p1's FIN with its own, in the background. Where that FIN
	// finds p1's SRQ already destroyed (in some runs only), its failure
	// puts a's uplink into recovery, and until it is up again a takes a
	// dial's reverse leg by two exchanges: dial 0 below would not try the
	// stale domain. The uplink is UP before that failure too, so waiting
	// for UP alone passed at once: wait for a's FIN to go or fail first.
	select {
	case <-toP1.closeDone:
	case <-time.After(5 * time.Second):
		t.Fatal("a did not answer p1's FIN within 5s")
	}
	eventually(t, "a's uplink into the old domain up again", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, u := range a.uplinks {
			if u.dom == p1.dom.ID {
				return u.state == upUp && !u.settling, fmt.Sprint(u.state, " settling ", u.settling)
			}
		}
		return false, "none"
	})
	p2 := w.endpoint("10.0.61.2", 7000, func(c *Config) { c.DomainDir = t.TempDir() + "/other" })
	if p2.dom.ID == p1.dom.ID {
		t.Fatal("setup: p2 shares p1's domain")
	}
	pair(t, p2, a2) // p2's uplink into a's node and domain: its dials to a are VIRT_REQs with ONE_EXCHANGE
	if got := addrDomain(a, p2); got != p1.dom.ID {
		t.Fatalf("setup: a knows %#x for p2's address, want p1's stale %#x", got, p1.dom.ID)
	}
	var conns []*Conn
	for i := range 3 {
		before, pb := a.Stats(), p2.Stats()
		c, d := pair(t, p2, a)
		roundTrip(t, c, d, []byte(fmt.Sprint("to a ", i)))
		roundTrip(t, d, c, []byte(fmt.Sprint("to p2 ", i)))
		conns = append(conns, c, d)
		if got := addrDomain(a, p2); got != p2.dom.ID {
			t.Fatalf("dial %d: a knows %#x for p2's address, want p2's %#x", i, got, p2.dom.ID)
		}
		after, pa := a.Stats(), p2.Stats()
		if i == 0 {
			// The stale domain cost this dial its first attempt: the
			// acceptor's half of it was abandoned, and the second
			// attempt asked by two exchanges.
			if pa.VirtReqs-pb.VirtReqs != 2 {
				t.Fatalf("dial 0 sent %d VIRT_REQs, want 2 (one attempt refused, one more)", pa.VirtReqs-pb.VirtReqs)
			}
			eventually(t, "a counts the first attempt abandoned", func() (bool, string) {
				n := a.Stats().Abandoned - before.Abandoned
				return n == 1, fmt.Sprint(n)
			})
			continue
		}
		if after.OneExchange-before.OneExchange != 1 || pa.VirtReqs-pb.VirtReqs != 1 {
			t.Fatalf("dial %d took %d one-exchange reverse legs and %d VIRT_REQs, want 1 and 1", i,
				after.OneExchange-before.OneExchange, pa.VirtReqs-pb.VirtReqs)
		}
	}
	// The old domain's uplink still serves k1.
	roundTrip(t, kc, ka, []byte("k1 unaffected"))
	roundTrip(t, ka, kc, []byte("k1 unaffected"))
	for _, c := range conns {
		c.Close()
	}
	eventually(t, "p2's connections released", func() (bool, string) {
		s := p2.Stats()
		return s.Conns == 1 && s.LocalCounts == 1, fmt.Sprintf("%+v", s)
	})
}

// A second process on a node whose domain the acceptor already reaches: the
// acceptor's reciprocal leg to it rides the existing uplink (a VIRT_REQ,
// accepted). That ACCEPT proves the address's domain (the acceptor refuses a
// foreign hint; the dialer checks the echo) and is learned. Only a PHYS
// exchange or a DOMAIN_MISMATCH taught it before, so every later dial from
// that process fell back to two exchanges, for as long as the uplink lived.
func TestDomainLearnedFromVirtAccept(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.60.1", 7000)
	p1 := w.endpoint("10.0.60.2", 7000)
	p2 := w.endpoint("10.0.60.2", 7001) // p1's node and domain
	pair(t, p1, a)                      // a's uplink into the node's domain (PHYS both ways)
	before := a.Stats()
	pair(t, p2, a) // p2's uplink (PHYS); a's reciprocal leg to p2: VIRT over a's uplink
	if s := a.Stats(); s.VirtReqs-before.VirtReqs != 1 || s.Uplinks != 1 {
		t.Fatalf("setup: a's reverse leg to p2 should be one VIRT_REQ over its one uplink: %+v (was %+v)", s, before)
	}
	if got := addrDomain(a, p2); got != p2.dom.ID {
		t.Fatalf("a knows %#x for p2's address after its VIRT_REQ there was accepted, want %#x", got, p2.dom.ID)
	}
	for i := range 3 {
		sa, sp := a.Stats(), p2.Stats()
		c, d := pair(t, p2, a)
		roundTrip(t, c, d, []byte("to a"))
		roundTrip(t, d, c, []byte("to p2"))
		ea, ep := a.Stats(), p2.Stats()
		if ea.OneExchange-sa.OneExchange != 1 || ep.OneExchange-sp.OneExchange != 1 || ea.VirtReqs != sa.VirtReqs {
			t.Fatalf("dial %d: a %d and p2 %d one-exchange reverse legs, a sent %d VIRT_REQs; want 1, 1, 0", i,
				ea.OneExchange-sa.OneExchange, ep.OneExchange-sp.OneExchange, ea.VirtReqs-sa.VirtReqs)
		}
	}
}

// replacingKernel runs before once, just before the first OpenXRCD.
type replacingKernel struct {
	kernel.Kernel
	once   *sync.Once
	before func()
}

func (k replacingKernel) OpenXRCD(path string, flags kernel.XRCDFlags) (kernel.XRCD, error) {
	k.once.Do(k.before)
	return k.Kernel.OpenXRCD(path, flags)
}

// The kernel opens the domain file by path after the engine read its id:
// a file replaced in between (unlinked, and made anew by another process)
// put the endpoint in the new file's XRCD under the old file's id. A peer
// that knew that id from another process of the node sent into the old
// domain's TGT, and every dial to the endpoint failed with TGT_GONE.
func TestEndpointDomainFileReplacedWhileOpening(t *testing.T) {
	w := newWorld(t)
	old := w.endpoint("10.1.0.1", 7000)
	dir := w.dirs["10.1.0.1"]
	a := w.wrappedEndpoint("10.1.0.1", 7001, func(k kernel.Kernel) kernel.Kernel {
		return replacingKernel{k, new(sync.Once), func() {
			if err := os.Remove(filepath.Join(dir, DomainFileName)); err != nil {
				t.Error(err)
			}
			if _, err := OpenDomainFile(context.Background(), dir); err != nil { // another process
				t.Error(err)
			}
		}}
	})
	d, err := OpenDomainFile(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.dom.ID != d.ID || old.dom.ID == d.ID {
		t.Errorf("domain ids: endpoint %x, its file %x, the old file's %x", a.dom.ID, d.ID, old.dom.ID)
	}
	r := w.endpoint("10.1.0.2", 7000)
	ro, oldc := pair(t, r, old) // r learns the old domain and has an uplink into it
	roundTrip(t, ro, oldc, []byte("to the old domain"))
	ra, ac := pair(t, r, a)
	roundTrip(t, ra, ac, []byte("to the new domain"))
	roundTrip(t, ac, ra, []byte("back"))
	roundTrip(t, ro, oldc, []byte("to the old domain again"))
}

// failingAccept fails the kernel's Accept (EIO) while armed.
type failingAccept struct {
	kernel.Kernel
	armed atomic.Bool
}

func (k *failingAccept) Accept(id kernel.ID, qpNum uint32, privateData []byte) error {
	if k.armed.Load() {
		return syscall.EIO
	}
	return k.Kernel.Accept(id, qpNum, privateData)
}

// Stats.OneExchange counts reverse legs set up inside the forward leg's
// exchange: an acceptor whose ACCEPT (carrying the reverse leg) the kernel
// failed set none up, and counted one.
func TestOneExchangeNotCountedWhenAcceptFails(t *testing.T) {
	w := newWorld(t)
	fa := &failingAccept{}
	a := w.wrappedEndpoint("10.0.61.1", 7000, func(k kernel.Kernel) kernel.Kernel { fa.Kernel = k; return fa })
	p1 := w.endpoint("10.0.61.2", 7000)
	p2 := w.endpoint("10.0.61.2", 7001) // p1's node and domain
	pair(t, p1, a)
	pair(t, p2, a)
	before := a.Stats()
	pair(t, p2, a)
	if n := a.Stats().OneExchange - before.OneExchange; n != 1 {
		t.Fatalf("setup: a dial from p2 took %d one-exchange reverse legs at a, want 1", n)
	}
	before = a.Stats()
	fa.armed.Store(true)
	_, err := p2.Dial(ctxT(t, time.Second), a.Addr().String())
	fa.armed.Store(false)
	t.Logf("dial with a's ACCEPT failing: %v", err)
	if n := a.Stats().OneExchange - before.OneExchange; n != 0 {
		t.Fatalf("a counted %d one-exchange reverse legs for ACCEPTs that never went", n)
	}
}
