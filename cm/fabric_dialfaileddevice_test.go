package cm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Dials racing their device's failure fail with ErrDeviceRemoved, not the
// device's bare EIO. The model fails the device's kernel calls with EIO at
// once, and the engine dies of it a moment later: a Dial whose call failed
// in between returned the bare EIO ("dial ...: ibv_create_qp_ex:
// input/output error", "rdma_connect ...: input/output error"), since
// Endpoint.Dial looked only for a closed endpoint or a dead process. Not
// deterministic: each round fails the device under eight Dials in flight on
// an open dialer endpoint; before the fix a round in the first few caught
// the window (3 of 3 runs). Found by a soak (helper 365).
func TestFabricDialsRacingDeviceFailureSayRemoved(t *testing.T) {
	f := newFabric(t)
	dir := t.TempDir()
	for round := range 150 {
		// A server of the round's own: one holding a hundred clients that
		// died in silence refuses new ones BUSY_RETRY.
		ctx, cancel := context.WithCancel(context.Background())
		l := holdingListener(ctx, t, f.Node(fmt.Sprintf("10.1.%d.1", round)).Process())
		cn := f.Node(fmt.Sprintf("10.2.%d.1", round))
		opts := []Option{WithHandshakeTimeout(5 * time.Second), WithFabric(cn.Process()), WithDomainPath(filepath.Join(dir, fmt.Sprint(round)))}
		var wg sync.WaitGroup
		var mu sync.Mutex
		first, err := Dial(context.Background(), l.Addr().String(), opts...) // opens the shared dialer endpoint
		if err != nil {
			t.Fatal(err)
		}
		conns := []*Conn{first}
		start := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				<-start
				for range 3 {
					c, err := Dial(context.Background(), l.Addr().String(), opts...)
					if err != nil {
						// A refusal that came before the failure
						// may stand; the device's own EIO may not.
						if errors.Is(err, syscall.EIO) && !errors.Is(err, ErrDeviceRemoved) {
							t.Errorf("round %d: a Dial as the device failed: %v, want ErrDeviceRemoved", round, err)
						}
						continue
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
			})
		}
		close(start)
		time.Sleep(time.Duration(round%8) * 100 * time.Microsecond) // to vary the Dials' stage, not to order anything
		cn.FailDevice()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
		cancel()
		l.Close()
		if t.Failed() {
			return
		}
	}
}
