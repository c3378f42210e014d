package xrc

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// killAt wraps a process's kernel and kills the process at the n-th call of
// op (before the call, or after it returns with after set). With n 0 it
// only counts.
type killAt struct {
	wrapper
	op     string
	n      int64
	after  bool
	armed  atomic.Bool
	calls  sync.Map // op -> *atomic.Int64
	kill   func()
	killed atomic.Bool
}

func (k *killAt) hit(op string, before bool) {
	if !k.armed.Load() {
		return
	}
	v, _ := k.calls.LoadOrStore(op, new(atomic.Int64))
	c := v.(*atomic.Int64)
	var n int64
	if before {
		n = c.Add(1)
	} else {
		n = c.Load()
	}
	if op == k.op && n == k.n && before != k.after && k.killed.CompareAndSwap(false, true) {
		k.kill()
	}
}

func (k *killAt) count(op string) int64 {
	v, ok := k.calls.Load(op)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

var killOps = []string{"CreateINI", "CreateTGT", "OpenTGT", "DestroyQP", "QueryQP", "TransitionQP", "Connect", "Accept", "Reject", "Establish", "Disconnect", "DestroyID", "Event", "PostSend"}

func (k *killAt) CreateINI() (kernel.QP, uint32, error) {
	k.hit("CreateINI", true)
	defer k.hit("CreateINI", false)
	return k.Kernel.CreateINI()
}
func (k *killAt) CreateTGT(d kernel.XRCD) (kernel.QP, uint32, error) {
	k.hit("CreateTGT", true)
	defer k.hit("CreateTGT", false)
	return k.Kernel.CreateTGT(d)
}
func (k *killAt) OpenTGT(d kernel.XRCD, qpn uint32) (kernel.QP, error) {
	k.hit("OpenTGT", true)
	defer k.hit("OpenTGT", false)
	return k.Kernel.OpenTGT(d, qpn)
}
func (k *killAt) DestroyQP(q kernel.QP) error {
	k.hit("DestroyQP", true)
	defer k.hit("DestroyQP", false)
	return k.Kernel.DestroyQP(q)
}
func (k *killAt) QueryQP(q kernel.QP) (kernel.QPInfo, error) {
	k.hit("QueryQP", true)
	defer k.hit("QueryQP", false)
	return k.Kernel.QueryQP(q)
}
func (k *killAt) TransitionQP(q kernel.QP, to verbs.QPState, via kernel.ID) error {
	k.hit("TransitionQP", true)
	defer k.hit("TransitionQP", false)
	return k.Kernel.TransitionQP(q, to, via)
}
func (k *killAt) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	k.hit("PostSend", true)
	defer k.hit("PostSend", false)
	return k.Kernel.PostSend(q, wrs)
}
func (k *killAt) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	k.hit("Connect", true)
	defer k.hit("Connect", false)
	return k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
}
func (k *killAt) Accept(id kernel.ID, qpNum uint32, pd []byte) error {
	k.hit("Accept", true)
	defer k.hit("Accept", false)
	return k.Kernel.Accept(id, qpNum, pd)
}
func (k *killAt) Reject(id kernel.ID, pd []byte) error {
	k.hit("Reject", true)
	defer k.hit("Reject", false)
	return k.Kernel.Reject(id, pd)
}
func (k *killAt) Establish(id kernel.ID) error {
	k.hit("Establish", true)
	defer k.hit("Establish", false)
	return k.Kernel.Establish(id)
}
func (k *killAt) Disconnect(id kernel.ID) error {
	k.hit("Disconnect", true)
	defer k.hit("Disconnect", false)
	return k.Kernel.Disconnect(id)
}
func (k *killAt) DestroyID(id kernel.ID) error {
	k.hit("DestroyID", true)
	defer k.hit("DestroyID", false)
	return k.Kernel.DestroyID(id)
}
func (k *killAt) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	k.hit("Event", true)
	ev, err := k.Kernel.Event(ctx, id)
	k.hit("Event", false)
	return ev, err
}

// sweepEnv is one run of a scenario: the process named victim is wrapped
// by a killAt for (op, n, after).
type sweepEnv struct {
	t      *testing.T
	w      *world
	victim string
	trig   string // whose n-th call kills victim (victim if empty)
	op     string
	n      int64
	after  bool
	ka     *killAt
	procs  map[string]*proc
	order  []string
	mu     sync.Mutex
	conns  []*Conn
	dead   map[string]bool // killed by the scenario itself
	ends   sync.WaitGroup
}

func (s *sweepEnv) ep(name, ip string, port int, mod ...func(*Config)) *proc {
	var wrap func(kernel.Kernel) kernel.Kernel
	if name == cmp.Or(s.trig, s.victim) {
		wrap = func(k kernel.Kernel) kernel.Kernel {
			s.ka = &killAt{wrapper: wrapper{k}, op: s.op, n: s.n, after: s.after, kill: func() { s.procs[s.victim].p.Kill() }}
			return s.ka
		}
	}
	p := s.w.wrappedEndpoint(ip, port, wrap, mod...)
	s.procs[name] = p
	s.order = append(s.order, name)
	return p
}

func (s *sweepEnv) arm() { s.ka.armed.Store(true) }

func (s *sweepEnv) keep(c *Conn) {
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
}

// serve accepts on p until it closes; each connection is read until it
// ends, then closed.
func (s *sweepEnv) serve(p *proc) {
	s.ends.Add(1)
	go func() {
		defer s.ends.Done()
		for {
			c, err := p.Accept(context.Background())
			if err != nil {
				return
			}
			s.keep(c)
			s.ends.Add(1)
			go func() {
				defer s.ends.Done()
				buf := make([]byte, 64)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					_, err := c.Recv(ctx, buf)
					cancel()
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
}

func (s *sweepEnv) dial(a, b *proc) (*Conn, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := a.Dial(ctx, b.Addr().String())
	if d := time.Since(start); d > 6*time.Second {
		s.t.Errorf("dial took %v", d)
	}
	if err == nil {
		s.keep(c)
	}
	return c, err
}

// dialSend dials b from a and, if the dial worked, sends three messages
// (their errors are the kill's business) and, with close, closes.
func (s *sweepEnv) dialSend(a, b *proc, close bool) {
	c, err := s.dial(a, b)
	if err != nil {
		return
	}
	for range 3 {
		c.Send(ctxT(s.t, 2*time.Second), []byte("hello"))
	}
	if close {
		c.Close()
	}
}

func (s *sweepEnv) alive(name string) bool {
	return !s.dead[name] && (name != s.victim || s.ka == nil || !s.ka.killed.Load())
}

// finish closes every connection, checks that the survivors hold nothing
// but their endpoint's own objects, then closes every endpoint and checks
// that every node and process holds nothing.
func (s *sweepEnv) finish() {
	t := s.t
	t.Helper()
	s.mu.Lock()
	conns := append([]*Conn(nil), s.conns...)
	s.mu.Unlock()
	for _, c := range conns {
		done := make(chan struct{})
		go func() { c.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("conn %v->%v Close hangs", c.LocalAddr(), c.RemoteAddr())
		}
	}
	idle := testIdle + testHeartbeat
	for _, name := range s.order {
		p := s.procs[name]
		deadline := time.Now().Add(idle + 6*time.Second)
		for s.alive(name) {
			st := p.Stats()
			ns := s.w.f.Node(p.Addr().Addr().String()).Stats()
			if st.Conns == 0 && st.QPs == 0 && st.LocalCounts == 0 && st.KernelHandles == 4 && ns.QPs() == 0 && ns.TGTHandles == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%v not released: %+v node %+v", p.Addr(), st, ns)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for _, n := range s.order {
		s.procs[n].Close()
	}
	done := make(chan struct{})
	go func() { s.ends.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(25 * time.Second):
		t.Errorf("serve loops hang")
	}
	for ip := range s.w.dirs {
		ns := s.w.f.Node(ip).Stats()
		if ns.INIs != 0 || ns.TGTs != 0 || ns.TGTHandles != 0 || ns.XRCDs != 0 {
			t.Errorf("node %s after all closed: %+v", ip, ns)
		}
	}
	for _, n := range s.order {
		if h := s.procs[n].p.Handles(); h != 0 {
			t.Errorf("%s holds %d handles after close", n, h)
		}
	}
}

type sweepScenario func(s *sweepEnv)

// killSweepAll runs every case of TestKillAnywhere (some 330 s); without
// it, the quick ones run (some 25 s), one or more per scenario.
var killSweepAll = os.Getenv("GOXRC_KILL_SWEEP") == "all"

// A process killed (kill -9: memfabric's Kill) at any point leaves nothing
// behind. Each case runs its scenario once to count the kernel calls its
// trigger process makes, then again for each call of each operation
// (killOps), killing the victim just before that call or just after it
// returns. Every run checks: dials end within their timeout, the
// survivors' other connections still carry messages both ways, and once
// all connections close every survivor holds only its endpoint's own
// objects; once all endpoints close, every node's INIs, TGTs, TGT handles
// and domains are 0, and so is every process's handle count. No failure
// found (about 1,500 kill points); it guards what the engine's release
// paths must keep. GOXRC_KILL_SWEEP=all runs every case;
// GOXRC_KILL_SWEEP_OP and GOXRC_KILL_SWEEP_MAXN narrow a run.
func TestKillAnywhere(t *testing.T) {
	for _, c := range []struct {
		name         string
		sc           sweepScenario
		victim, trig string // trig: whose n-th call kills victim (victim if empty)
		quick        bool
	}{
		{"dial/A", scDial, "A", "", true}, {"dial/B", scDial, "B", "", true},
		{"dial/B-by-A", scDial, "B", "A", false}, {"dial/A-by-B", scDial, "A", "B", false},
		{"dial2/A", scDial2, "A", "", true}, {"dial2/B", scDial2, "B", "", false},
		{"dial2/B-by-A", scDial2, "B", "A", false}, {"dial2/A-by-B", scDial2, "A", "B", false},
		{"share/A", scShare, "A", "", false}, {"share/B1", scShare, "B1", "", true}, {"share/B2", scShare, "B2", "", true},
		{"share/B1-by-B2", scShare, "B1", "B2", false}, {"share/B1-by-A", scShare, "B1", "A", false},
		{"share/B2-by-A", scShare, "B2", "A", true}, {"share/A-by-B2", scShare, "A", "B2", false},
		{"sharerev/A1", scShareRev, "A1", "", true}, {"sharerev/A2", scShareRev, "A2", "", true}, {"sharerev/B", scShareRev, "B", "", false},
		{"sharerev/A1-by-A2", scShareRev, "A1", "A2", false}, {"sharerev/A1-by-B", scShareRev, "A1", "B", false},
		{"sharerev/B-by-A2", scShareRev, "B", "A2", false}, {"sharerev/A2-by-B", scShareRev, "A2", "B", false},
		{"close/A", scClose, "A", "", true}, {"close/B", scClose, "B", "", false},
		{"recover/A", scRecover, "A", "", false}, {"recover/B2", scRecover, "B2", "", true},
		{"recover/B2-by-A", scRecover, "B2", "A", false}, {"recover/A-by-B2", scRecover, "A", "B2", false},
		{"recover3/A", scRecover3, "A", "", false}, {"recover3/B3", scRecover3, "B3", "", true},
		{"recover3/B3-by-A", scRecover3, "B3", "A", false}, {"recover3/B3-by-B2", scRecover3, "B3", "B2", false},
		{"recover3/B2-by-B3", scRecover3, "B2", "B3", true}, {"recover3/B2-by-A", scRecover3, "B2", "A", false},
		{"recover3/A-by-B3", scRecover3, "A", "B3", false},
		{"concurrent/A", scConcurrent, "A", "", false}, {"concurrent/B1", scConcurrent, "B1", "", false},
		{"concurrent/B2", scConcurrent, "B2", "", true}, {"concurrent/B1-by-B2", scConcurrent, "B1", "B2", false},
		{"concurrent/B1-by-A", scConcurrent, "B1", "A", false}, {"concurrent/B2-by-B1", scConcurrent, "B2", "B1", false},
		{"oneexchange/A2", scOneEx, "A2", "", false}, {"oneexchange/B", scOneEx, "B", "", false},
		{"oneexchange/A1-by-A2", scOneEx, "A1", "A2", false}, {"oneexchange/A1-by-B", scOneEx, "A1", "B", true},
		{"oneexchange/B-by-A2", scOneEx, "B", "A2", false}, {"oneexchange/A2-by-B", scOneEx, "A2", "B", false},
		{"oneexchange/C-by-A2", scOneEx, "C", "A2", false}, {"oneexchange/C-by-B", scOneEx, "C", "B", true},
	} {
		if !c.quick && !killSweepAll {
			continue
		}
		t.Run(c.name, func(t *testing.T) { runSweep(t, c.victim, c.trig, c.sc) })
	}
}

func runSweep(t *testing.T, victim, trig string, sc sweepScenario) {
	cnt := &sweepEnv{t: t, w: newWorld(t), victim: victim, trig: trig, procs: map[string]*proc{}}
	sc(cnt)
	sweepCalls(t, cnt.ka.count, func(t *testing.T, op string, n int64, after bool) {
		s := &sweepEnv{t: t, w: newWorld(t), victim: victim, trig: trig, op: op, n: n, after: after, procs: map[string]*proc{}}
		sc(s)
		if !s.ka.killed.Load() {
			t.Logf("no kill: the run made fewer %s calls than the counting run", op)
		}
	})
}

// sweepCalls runs one subtest per kernel call that count says a counting
// run made: for each op of killOps, its n-th call, struck before the call
// and as it returns. GOXRC_KILL_SWEEP_OP keeps one op, and
// GOXRC_KILL_SWEEP_MAXN the first calls of each.
func sweepCalls(t *testing.T, count func(op string) int64, run func(t *testing.T, op string, n int64, after bool)) {
	only := os.Getenv("GOXRC_KILL_SWEEP_OP")
	maxN, _ := strconv.Atoi(os.Getenv("GOXRC_KILL_SWEEP_MAXN"))
	for _, op := range killOps {
		if only != "" && only != op {
			continue
		}
		total := count(op)
		if maxN > 0 && total > int64(maxN) {
			total = int64(maxN)
		}
		for n := int64(1); n <= total; n++ {
			for _, after := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%d/after=%v", op, n, after), func(t *testing.T) { run(t, op, n, after) })
			}
		}
	}
}

// scDial: A dials B, sends, closes.
func scDial(s *sweepEnv) {
	a := s.ep("A", "10.0.0.1", 7000)
	b := s.ep("B", "10.0.0.2", 7000)
	s.serve(b)
	s.arm()
	s.dialSend(a, b, true)
	s.finish()
}

// exchange sends on c and, if d is given, checks d receives it.
func (s *sweepEnv) works(x, y string, c, d *Conn) {
	s.t.Helper()
	s.ka.armed.Store(false)
	defer s.ka.armed.Store(true)
	time.Sleep(time.Millisecond) // a kill under way ends
	if !s.alive(x) || !s.alive(y) {
		return
	}
	roundTrip(s.t, c, d, []byte("still here"))
	roundTrip(s.t, d, c, []byte("and here"))
}

// pairKeep is pair, the connections kept for finish.
func (s *sweepEnv) pairKeep(a, b *proc) (*Conn, *Conn) {
	ca, cb := pair(s.t, a, b)
	s.keep(ca)
	s.keep(cb)
	return ca, cb
}

// dialBeside: x and y are up (their connection kept); armed, from dials
// to, sends and closes; x and y's connection still carries messages.
func (s *sweepEnv) dialBeside(x, y, from, to string) {
	c, d := s.pairKeep(s.procs[x], s.procs[y])
	s.serve(s.procs[to])
	s.arm()
	s.dialSend(s.procs[from], s.procs[to], true)
	s.works(x, y, c, d)
	s.finish()
}

// scDial2: A dials B a second time (over the uplinks the first made).
func scDial2(s *sweepEnv) {
	s.ep("A", "10.0.0.1", 7000)
	s.ep("B", "10.0.0.2", 7000)
	s.dialBeside("A", "B", "A", "B")
}

// scShare: A is up with B1; A dials B2, on B1's node and domain (B2 opens
// B1's TGT; its reverse leg makes a TGT on A's node).
func scShare(s *sweepEnv) {
	s.ep("A", "10.0.0.1", 7000)
	s.ep("B1", "10.0.0.2", 7000)
	s.ep("B2", "10.0.0.2", 7001)
	s.dialBeside("A", "B1", "A", "B2")
}

// scShareRev: A1 is up with B; A2, on A1's node and domain, dials B: B's
// reverse leg rides its uplink to A1's TGT, which A2 opens.
func scShareRev(s *sweepEnv) {
	s.ep("A1", "10.0.0.1", 7000)
	s.ep("A2", "10.0.0.1", 7001)
	s.ep("B", "10.0.0.2", 7000)
	s.dialBeside("A1", "B", "A2", "B")
}

// scClose: A and B, up, close their connection at once.
func scClose(s *sweepEnv) {
	a := s.ep("A", "10.0.0.1", 7000)
	b := s.ep("B", "10.0.0.2", 7000)
	c1, d1 := s.pairKeep(a, b)
	c2, d2 := s.pairKeep(a, b)
	roundTrip(s.t, c1, d1, []byte("x"))
	s.arm()
	var wg sync.WaitGroup
	for _, c := range []*Conn{c1, d1} {
		wg.Add(1)
		go func() { defer wg.Done(); c.Close() }()
	}
	wg.Wait()
	s.works("A", "B", c2, d2)
	s.finish()
}

// creatorDies: x is up with creator (the TGT's creator) and each of
// sharers (sharing it); armed, creator dies: x's connection to it fails,
// and x's recovery moves each sharer's leg, whose connection still carries
// messages.
func (s *sweepEnv) creatorDies(x, creator string, sharers ...string) {
	c1, _ := s.pairKeep(s.procs[x], s.procs[creator])
	var cs, ds []*Conn
	for _, n := range sharers {
		c, d := s.pairKeep(s.procs[x], s.procs[n])
		cs, ds = append(cs, c), append(ds, d)
	}
	s.arm()
	s.dead = map[string]bool{creator: true}
	s.procs[creator].p.Kill()
	sendErr(s.t, c1)
	for i, n := range sharers {
		s.works(x, n, cs[i], ds[i])
	}
	s.finish()
}

// scRecover: A is up with B1 (the TGT's creator) and B2 (sharing it); B1
// dies and A's recovery moves B2's leg by a PHYS_REQ flagged REPLACES_TGT.
func scRecover(s *sweepEnv) {
	s.ep("A", "10.0.0.1", 7000)
	s.ep("B1", "10.0.0.2", 7000)
	s.ep("B2", "10.0.0.2", 7001)
	s.creatorDies("A", "B1", "B2")
}

// scRecover3: A is up with B1 (the TGT's creator), B2 and B3 (sharing
// it); B1 dies: A's recovery moves B2's leg by PHYS, B3's by VIRT.
func scRecover3(s *sweepEnv) {
	s.ep("A", "10.0.0.1", 7000)
	s.ep("B1", "10.0.0.2", 7000)
	s.ep("B2", "10.0.0.2", 7001)
	s.ep("B3", "10.0.0.2", 7002)
	s.creatorDies("A", "B1", "B2", "B3")
}

// scConcurrent: A dials B1 and B2, on one node, at once.
func scConcurrent(s *sweepEnv) {
	a := s.ep("A", "10.0.0.1", 7000)
	b1 := s.ep("B1", "10.0.0.2", 7000)
	b2 := s.ep("B2", "10.0.0.2", 7001)
	s.serve(b1)
	s.serve(b2)
	s.arm()
	var wg sync.WaitGroup
	for _, b := range []*proc{b1, b2, b1} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.dialSend(a, b, false)
		}()
	}
	wg.Wait()
	s.finish()
}

// scOneEx: A1 is up with B (B's uplink reaches A1's TGT), A2 with C (A2's
// uplink reaches C's node); A2 dials B: one exchange, the reverse leg
// rides B's uplink to A1's TGT, which A2 opens.
func scOneEx(s *sweepEnv) {
	a1 := s.ep("A1", "10.0.0.1", 7000)
	a2 := s.ep("A2", "10.0.0.1", 7001)
	b := s.ep("B", "10.0.0.2", 7000)
	c := s.ep("C", "10.0.0.2", 7001)
	c1, d1 := s.pairKeep(a1, b)
	c2, d2 := s.pairKeep(a2, c)
	s.serve(b)
	s.arm()
	s.dialSend(a2, b, false)
	s.works("A1", "B", c1, d1)
	s.works("A2", "C", c2, d2)
	s.finish()
}
