package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// breakAt calls brk at its n-th kernel call (0: never) and counts them.
type breakAt struct {
	wrapper
	n     int64
	calls atomic.Int64
	brk   func()
}

func (b *breakAt) step() {
	if b.calls.Add(1) == b.n {
		b.brk()
	}
}
func (b *breakAt) CreateINI() (kernel.QP, uint32, error) { b.step(); return b.Kernel.CreateINI() }
func (b *breakAt) CreateTGT(d kernel.XRCD) (kernel.QP, uint32, error) {
	b.step()
	return b.Kernel.CreateTGT(d)
}
func (b *breakAt) OpenTGT(d kernel.XRCD, qpn uint32) (kernel.QP, error) {
	b.step()
	return b.Kernel.OpenTGT(d, qpn)
}
func (b *breakAt) DestroyQP(q kernel.QP) error { b.step(); return b.Kernel.DestroyQP(q) }
func (b *breakAt) TransitionQP(q kernel.QP, to verbs.QPState, via kernel.ID) error {
	b.step()
	return b.Kernel.TransitionQP(q, to, via)
}
func (b *breakAt) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	b.step()
	return b.Kernel.PostSend(q, wrs)
}
func (b *breakAt) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	b.step()
	return b.Kernel.Connect(ctx, dst, ex, qpNum, pd)
}
func (b *breakAt) Accept(id kernel.ID, qpNum uint32, pd []byte) error {
	b.step()
	return b.Kernel.Accept(id, qpNum, pd)
}
func (b *breakAt) Reject(id kernel.ID, pd []byte) error { b.step(); return b.Kernel.Reject(id, pd) }
func (b *breakAt) Establish(id kernel.ID) error         { b.step(); return b.Kernel.Establish(id) }
func (b *breakAt) Disconnect(id kernel.ID) error        { b.step(); return b.Kernel.Disconnect(id) }
func (b *breakAt) DestroyID(id kernel.ID) error         { b.step(); return b.Kernel.DestroyID(id) }

// Breaks B's receive poll or CM event channel at each of its kernel calls
// in a scenario of dials both ways and messages; then B fails, a Dial to it
// fails, and once both are closed nothing is left and no id was destroyed
// twice.
func TestBreakAnywhere(t *testing.T) {
	for _, how := range []string{"recv", "events"} {
		t.Run(how, func(t *testing.T) {
			// The number of calls varies from run to run (receive
			// polls, retries), so the sweep goes on until a run made
			// fewer calls than the step it was to break at: every step
			// of that run was covered.
			n := int64(1)
			for ; n <= 500; n++ {
				var calls int64
				t.Run(fmt.Sprint(n), func(t *testing.T) { calls = breakScenario(t, how, n) })
				if calls < n || t.Failed() {
					break
				}
			}
			t.Logf("%d steps", n-1)
			if n < 10 {
				t.Errorf("only %d steps: the scenario makes fewer kernel calls than a dial and an accept", n-1)
			}
		})
	}
}

func breakScenario(t *testing.T, how string, n int64) int64 {
	w := newWorld(t)
	var dc *destroyCount
	var ba *breakAt
	var brk func()
	b := w.wrappedEndpoint("10.0.71.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		dc = &destroyCount{wrapper: wrapper{k}, n: map[kernel.ID]int{}}
		var inner kernel.Kernel
		if how == "recv" {
			rb := &recvBroken{wrapper: wrapper{dc}}
			rb.broken, rb.brk = context.WithCancel(context.Background())
			inner, brk = rb, rb.brk
		} else {
			eb := newEventsBroken(dc)
			inner, brk = eb, eb.brk
		}
		ba = &breakAt{wrapper: wrapper{inner}, n: n, brk: brk}
		return ba
	})
	a := w.endpoint("10.0.71.2", 7000)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 2 {
			c, err := b.Accept(ctxT(t, 3*time.Second))
			if err != nil {
				return
			}
			c.Send(ctxT(t, 3*time.Second), []byte("from b"))
			c.Recv(ctxT(t, 3*time.Second), make([]byte, 64))
			defer c.Close()
		}
	}()
	for range 2 {
		c, err := a.Dial(ctxT(t, 3*time.Second), b.Addr().String())
		if err != nil {
			continue
		}
		c.Send(ctxT(t, 3*time.Second), []byte("from a"))
		c.Recv(ctxT(t, 3*time.Second), make([]byte, 64))
		defer c.Close()
	}
	if c, err := b.Dial(ctxT(t, 3*time.Second), a.Addr().String()); err == nil {
		c.Send(ctxT(t, 3*time.Second), []byte("b dials"))
		defer c.Close()
	}
	wg.Wait()
	total := ba.calls.Load()
	if n == 0 {
		return total
	}
	brk() // not broken yet if n is past this run's calls
	eventually(t, "B failed", func() (bool, string) { return b.Err() != nil, "Err nil" })
	start := time.Now()
	var rj *RejectError
	if c, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String()); err == nil {
		c.Close()
		t.Errorf("Dial to the failed B succeeded")
	} else if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Dial to the failed B: %v after %v", err, took)
	} else if !errors.As(err, &rj) || rj.Reason != RejectNoListener {
		t.Errorf("Dial to the failed B: %v, want a REJECT NO_LISTENER (Endpoint.Err's doc)", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if h := b.p.Handles(); h != 0 {
		t.Errorf("B holds %d handles after Close", h)
	}
	if ids := dc.twice(); len(ids) > 0 {
		t.Errorf("ids %v destroyed twice", ids)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if h := a.p.Handles(); h != 0 {
		t.Errorf("A holds %d handles after Close", h)
	}
	return total
}
