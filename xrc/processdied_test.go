package xrc

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// A process killed under its endpoint (memfabric's Kill: every kernel
// object and CM id it holds closed at once, as kill -9 does) is no Close of
// the application's: Endpoint.Err, and what the endpoint's calls and its
// connections' return, match ErrProcessDied and not ErrClosed, which says
// the application closed them (cm takes it so). Connections with traffic
// in flight at the kill fail so too, whichever kernel call saw it first.
func TestEndpointProcessKilledIsNotClosed(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.197.1", 7000), w.endpoint("10.0.197.2", 7000)
	idle, _ := pair(t, a, b)
	var busy []*Conn
	for range 3 {
		ca, cb := pair(t, a, b)
		busy = append(busy, ca)
		go func() { // b echoes, until its connection ends
			buf := make([]byte, 64)
			for {
				n, err := cb.Recv(ctxT(t, 10*time.Second), buf)
				if err != nil || cb.Send(ctxT(t, 10*time.Second), buf[:n]) != nil {
					return
				}
			}
		}()
	}
	var wg sync.WaitGroup
	errs := make([]error, len(busy))
	for i, c := range busy {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64)
			for {
				if err := c.Send(ctxT(t, 10*time.Second), []byte("ping")); err != nil {
					errs[i] = err
					return
				}
				if _, err := c.Recv(ctxT(t, 10*time.Second), buf); err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	a.p.Kill()
	wg.Wait()
	eventually(t, "the endpoint's end", func() (bool, string) { return a.Err() != nil, "Err nil" })
	check := func(what string, err error) {
		t.Helper()
		if errors.Is(err, ErrClosed) || !errors.Is(err, ErrProcessDied) {
			t.Errorf("%s after the process's kill: %v; want ErrProcessDied, not ErrClosed (the application closed nothing)", what, err)
		}
	}
	check("Endpoint.Err", a.Err())
	for i, err := range errs {
		check(fmt.Sprintf("busy connection %d", i), err)
	}
	_, err := a.Accept(ctxT(t, time.Second))
	check("Accept", err)
	_, err = a.Dial(ctxT(t, time.Second), b.Addr().String())
	check("Dial", err)
	check("Send", idle.Send(ctxT(t, time.Second), []byte("x")))
	_, err = idle.Recv(ctxT(t, time.Second), make([]byte, 8))
	check("Recv", err)
	check("CloseWrite", idle.CloseWrite())
	check("Conn.Err", idle.Err())
	// Close ends the goroutines; the cause stays.
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	check("Endpoint.Err after Close", a.Err())
}

// A node's PowerOff kills its processes, as Kill does: their endpoints say
// ErrProcessDied, not ErrClosed.
func TestEndpointPowerOffIsProcessDeath(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.198.1", 7000), w.endpoint("10.0.198.2", 7000)
	ca, _ := pair(t, a, b)
	w.f.Node("10.0.198.1").PowerOff()
	eventually(t, "the endpoint's end", func() (bool, string) { return a.Err() != nil, "Err nil" })
	for what, err := range map[string]error{"Endpoint.Err": a.Err(), "Send": ca.Send(ctxT(t, time.Second), []byte("x"))} {
		if errors.Is(err, ErrClosed) || !errors.Is(err, ErrProcessDied) {
			t.Errorf("%s after the node's PowerOff: %v; want ErrProcessDied, not ErrClosed", what, err)
		}
	}
}
