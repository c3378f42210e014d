// Package memfabric is an in-memory RDMA fabric with XRC, for tests of code
// built on this library where no RDMA device exists (like gRPC's bufconn).
//
// A Fabric holds nodes addressed by IP; each node is one RDMA device with
// XRC; a node runs processes. A Process is what the XRC engine (and cm's
// XRC mode) runs on instead of a real device: pass it as xrc.Config.Process,
// or to package cm's Listen and Dial with cm.WithFabric.
// Kill is a process's kill -9: everything it holds in the kernel is closed
// at once, with what the real kernel sends for it (a DREQ for an INI-side CM
// connection, nothing for a TGT-side one). Engines on a killed process
// fail with xrc.ErrProcessDied, which does not match xrc.ErrClosed: the
// application closed nothing.
//
// Underneath is the module's kernel model, which follows the kernel's XRC and
// RDMA CM semantics rule for rule: XRC domains by inode, TGT QPs that live as
// long as some process holds a handle, QP and SRQ numbers reused at once
// (most recently freed first), the CM's stale-connection table, private-data
// budgets, SIDR and connected exchanges sharing a port number.
package memfabric

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/model"
)

func init() {
	kernel.RegisterUnwrapper(func(v any) (kernel.Kernel, bool) {
		p, ok := v.(*Process)
		switch {
		case !ok || p == nil:
			return nil, false
		case p.k != nil:
			return p.k, true
		case p.p != nil:
			return p.p, true
		}
		return nil, false
	})
	kernel.Carry = func(k kernel.Kernel) any { return &Process{k: k} }
}

// Fabric is a set of nodes that reach each other by IP address. Make one
// with New: a nil or zero Fabric has no fabric under it, and its methods
// panic with a message that says so.
type Fabric struct {
	f     *model.Fabric
	mu    sync.Mutex
	nodes map[netip.Addr]*Node
}

// made panics unless New made f: a nil or zero Fabric's calls would
// otherwise fail with a nil dereference deep in the kernel model.
func (f *Fabric) made() {
	if f == nil || f.f == nil {
		panic("memfabric: a nil or zero Fabric: make one with New")
	}
}

// New returns an empty fabric.
func New() *Fabric {
	return &Fabric{f: model.NewFabric(model.ReuseLIFO), nodes: map[netip.Addr]*Node{}}
}

// Node returns the node at ip, adding it with the default NodeConfig on
// first use. It panics if ip is not an IP address.
func (f *Fabric) Node(ip string) *Node {
	f.made()
	a := parseIP(ip)
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.nodes[a]; n != nil {
		return n
	}
	return f.addLocked(a, NodeConfig{})
}

// NodeConfig describes a node's device.
type NodeConfig struct {
	// SendQueueDepth is the depth of each XRC send QP's send queue
	// (max_send_wr): as on a real device, a post finds the queue full
	// (ENOMEM) while that many sends wait for their completions to be
	// polled. Default 256, what the engine asks of a real device.
	SendQueueDepth int
	// SRQReceives is how many receives each XRC SRQ on the node holds
	// posted (the engine reposts each as it takes the message). A message
	// that finds none is refused receiver-not-ready, which the sending QP
	// retries for ever, as the engine asks of a real device: it waits, with
	// every later send of that QP to any process of the node behind it,
	// until the receiving process takes a message. Default 0: unlimited, no
	// such waits.
	SRQReceives int
}

// AddNode adds the node at ip with cfg. It panics if ip is not an IP address
// or the node exists.
func (f *Fabric) AddNode(ip string, cfg NodeConfig) *Node {
	f.made()
	a := parseIP(ip)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nodes[a] != nil {
		panic("memfabric: node " + ip + " exists")
	}
	return f.addLocked(a, cfg)
}

func (f *Fabric) addLocked(a netip.Addr, cfg NodeConfig) *Node {
	n := &Node{n: f.f.AddNode(a, model.NodeConfig{SendQueueDepth: cfg.SendQueueDepth, SRQReceives: cfg.SRQReceives})}
	f.nodes[a] = n
	return n
}

// parseIP parses a node's address in the form the engine and package cm
// dial it in: an IPv4-mapped address unmapped, and without its zone, which
// names the one link a link-local address is on ("fe80::1%eth0" is node
// fe80::1).
func parseIP(ip string) netip.Addr {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		panic(fmt.Sprintf("memfabric: %v", err))
	}
	return a.Unmap().WithZone("")
}

// Node is one host with one RDMA device, made by a Fabric's Node or AddNode
// (the methods of a nil or zero Node panic with a message that says so).
type Node struct{ n *model.Node }

// modelNode returns the node's model, or panics for a nil or zero Node,
// whose calls would otherwise fail with a nil dereference deep in the model.
func (n *Node) modelNode() *model.Node {
	if n == nil || n.n == nil {
		panic("memfabric: a nil or zero Node: get one from a Fabric's Node or AddNode")
	}
	return n.n
}

// Addr is the node's address.
func (n *Node) Addr() netip.Addr { return n.modelNode().Addr() }

// Process starts a process on the node. It lives until Kill or the node's
// PowerOff (one started after PowerOff lives, cut off: see PowerOff),
// however many engines ran on it and closed: the node keeps it,
// so a test that starts processes kills them when it is done with them.
func (n *Node) Process() *Process { return &Process{p: n.modelNode().NewProcess(), n: n} }

// PowerOff takes the node off the fabric as a power cut does: its processes
// die without a word to their peers, requests to it get no answer, and
// sends to it fail as the device's retries running out do. Peers find out
// by their own timeouts (Config.IdleTimeout, Config.HandshakeTimeout).
// Engines running on the node fail from then on, as after Kill
// (xrc.ErrProcessDied); close them to end their goroutines. The node stays
// off: a process started on it later is alive (an engine starts and
// listens on it) but reaches nothing and is reached by nothing: its Dials
// and those to it get no answer and end at their context's deadline (or
// Config.HandshakeTimeout), where after FailDevice an engine fails at once.
func (n *Node) PowerOff() { n.modelNode().PowerOff() }

// FailDevice makes the node's RDMA device fail for good, as a firmware
// fault does (IBV_EVENT_DEVICE_FATAL): the node sends nothing and answers
// nothing from then on, as after PowerOff, but its processes live on; their
// engines learn of it from the device, fail every connection with
// ErrDeviceRemoved and close themselves. Peers find out by their own
// timeouts. The device stays failed: an engine started on the node later
// fails at once.
func (n *Node) FailDevice() { n.modelNode().FailDevice() }

// NodeStats counts the node's kernel objects.
type NodeStats struct {
	INIs       int // XRC send QPs
	TGTs       int // XRC receive QPs (each once, however many handles)
	TGTHandles int // the node-wide registration count: handles over all TGTs
	XRCDs      int // live XRC domains
	// RNRNAKs counts messages to the node's SRQs refused for want of a
	// posted receive (NodeConfig.SRQReceives), once for each try.
	RNRNAKs uint64
}

// QPs is the number of QPs on the node (INIs + TGTs).
func (s NodeStats) QPs() int { return s.INIs + s.TGTs }

// Stats returns the node's counts, all taken at one instant (one state of
// the node, however its processes run meanwhile).
func (n *Node) Stats() NodeStats {
	c := n.modelNode().Counts()
	return NodeStats{INIs: c.INIs, TGTs: c.TGTs, TGTHandles: c.TGTHandles, XRCDs: c.XRCDs, RNRNAKs: c.RNRNAKs}
}

// Process is one process on a node: what the XRC engine runs on, made by
// Node.Process. A nil or zero Process is no node's and holds nothing: its
// methods do nothing (Kill, PauseReceives, ResumeReceives) or return zero
// values (Handles 0, Node nil), as a nil object of package cm or xrc is a
// closed one. (xrc.NewEndpoint, and cm's Listen and Dial with WithFabric,
// refuse a zero Process with an error matching xrc.ErrNoKernel, and take a
// nil one for none: a real device.)
type Process struct {
	p *model.Process
	n *Node
	// k, instead of p and n: a kernel of the module's tests
	// (kernel.Carry), with no node of a Fabric; its owner closes it
	// (Kill does not).
	k kernel.Kernel
}

// Node is the node the process runs on.
func (p *Process) Node() *Node {
	if p == nil {
		return nil
	}
	return p.n
}

// Kill ends the process as kill -9 does: every kernel object and CM id it
// holds is closed at once. Engines running on it fail from then on, with
// xrc.ErrProcessDied (their Err, their calls and their connections'; not
// xrc.ErrClosed, which says the application closed them); close them to
// end their goroutines. Kill of a dead process (killed, or its
// node powered off) does nothing.
func (p *Process) Kill() {
	if p != nil && p.p != nil {
		p.p.Kill()
	}
}

// PauseReceives makes the process stop taking messages, as one stopped
// (SIGSTOP) or stalled would, until ResumeReceives: its engine's receive
// poll finds nothing and the messages stay on its SRQ, where, on a node
// with NodeConfig.SRQReceives, the next ones find no receive and wait at
// their senders. The rest of the engine runs on, its timers too, unlike a
// stopped process's: a pause longer than its Config.IdleTimeout fails the
// process's connections for their peers' silence (ErrPeerGone), with the
// messages that wait for them on its SRQ.
func (p *Process) PauseReceives() {
	if p != nil && p.p != nil {
		p.p.PauseReceives()
	}
}

// ResumeReceives ends PauseReceives.
func (p *Process) ResumeReceives() {
	if p != nil && p.p != nil {
		p.p.ResumeReceives()
	}
}

// Handles is the number of kernel handles (domains, SRQs, QPs, TGT handles,
// CM ids) the process holds.
func (p *Process) Handles() int {
	if p == nil {
		return 0
	}
	if h, ok := p.k.(interface{ Handles() int }); ok {
		return h.Handles()
	}
	if p.p == nil {
		return 0 // not a node's process: it holds nothing
	}
	return p.p.Handles()
}
