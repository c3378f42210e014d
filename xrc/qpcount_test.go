package xrc_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// TestQPCountTable: N nodes x P processes on memfabric, every process
// connected to every process of the other nodes through the engine's public
// API (NewEndpoint, one Dial per pair: connections are bidirectional). Per
// node, XRC holds P*(N-1) INIs + P*(N-1) TGTs = 2*P*(N-1) QPs, and
// P*P*(N-1) TGT handles (each TGT registered once per local receiver); RC
// needs one QP per connection end, P*P*(N-1) per node. With -v it prints the
// table that test/bench-xrc.sh puts in docs/xrc-benchmarks.md.
func TestQPCountTable(t *testing.T) {
	shapes := []struct{ N, P int }{{2, 2}, {3, 4}, {4, 4}, {4, 8}}
	var rows []string
	for _, sh := range shapes {
		t.Run(fmt.Sprintf("N%dxP%d", sh.N, sh.P), func(t *testing.T) {
			rows = append(rows, qpCountAllToAll(t, sh.N, sh.P)...)
		})
	}
	var b strings.Builder
	b.WriteString("| N x P | node | XRC INIs | XRC TGTs | XRC QPs (want 2P(N-1)) | TGT handles (want P*P(N-1)) | kernel handles (want 4P+3P(N-1)+P*P(N-1)) | RC QPs P*P(N-1) | RC/XRC QPs |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r + "\n")
	}
	t.Logf("QP-COUNT-TABLE\n%sEND-QP-COUNT-TABLE", b.String())
}

func qpCountAllToAll(t *testing.T, N, P int) []string {
	f := memfabric.New()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	eps := make([][]*xrc.Endpoint, N)
	procs := make([][]*memfabric.Process, N)
	for i := range N {
		ip := fmt.Sprintf("10.0.9.%d", i+1)
		dir := t.TempDir() + "/goxrc"
		for j := range P {
			p := f.Node(ip).Process()
			e, err := xrc.NewEndpoint(ctx, xrc.Config{Process: p, Addr: fmt.Sprintf("%s:%d", ip, 7100+j), DomainDir: dir,
				Heartbeat: 200 * time.Millisecond, IdleTimeout: 10 * time.Second, HandshakeTimeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			eps[i] = append(eps[i], e)
			procs[i] = append(procs[i], p)
		}
	}
	var accepting sync.WaitGroup
	accepted := make(chan struct{}, P*P*N*(N-1))
	for i := range N {
		for j := range P {
			e := eps[i][j]
			accepting.Add(1)
			go func() {
				defer accepting.Done()
				for {
					if _, err := e.Accept(ctx); err != nil {
						return
					}
					accepted <- struct{}{}
				}
			}()
		}
	}
	var dials sync.WaitGroup
	for i := range N {
		for j := range P {
			for k := i + 1; k < N; k++ {
				for l := range P {
					dials.Add(1)
					go func() {
						defer dials.Done()
						if _, err := eps[i][j].Dial(ctx, eps[k][l].Addr().String()); err != nil {
							t.Errorf("%d.%d -> %d.%d: %v", i, j, k, l, err)
						}
					}()
				}
			}
		}
	}
	dials.Wait()
	if t.Failed() {
		t.FailNow()
	}
	conns := P * P * N * (N - 1) / 2
	for n := range conns {
		select {
		case <-accepted:
		case <-ctx.Done():
			t.Fatalf("%d connections accepted, want %d", n, conns)
		}
	}
	// Every endpoint holds a connection to every process of the other nodes.
	for i := range N {
		for j := range P {
			if s := eps[i][j].Stats(); s.Conns != P*(N-1) || s.Uplinks != N-1 {
				t.Errorf("endpoint %d.%d: %+v, want %d connections over %d uplinks", i, j, s, P*(N-1), N-1)
			}
		}
	}
	// Kernel handles per node, over its P processes: each has its domain,
	// SRQ and two listening CM ids (4P), an INI and the INI's CM id per
	// remote node (2P(N-1)); the node holds P(N-1) TGT-side CM ids (one per
	// TGT, kept by the process that created it) and the TGT handles. The
	// virtual legs' SIDR ids are destroyed once answered, but maybe only
	// after Dial has returned: wait for them.
	xrcQPs, tgtHandles, rcQPs := 2*P*(N-1), P*P*(N-1), P*P*(N-1)
	wantHandles := 4*P + 3*P*(N-1) + tgtHandles
	nodeHandles := func(i int) int {
		h := 0
		for _, p := range procs[i] {
			h += p.Handles()
		}
		return h
	}
	for i := range N {
		for deadline := time.Now().Add(5 * time.Second); nodeHandles(i) != wantHandles && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	var rows []string
	for i := range N {
		s := procs[i][0].Node().Stats()
		handles := nodeHandles(i)
		if handles != wantHandles {
			t.Errorf("N=%d P=%d node %d: %d kernel handles, want 4P+3P(N-1)+P*P(N-1) = %d", N, P, i, handles, wantHandles)
		}
		if s.INIs != P*(N-1) || s.TGTs != P*(N-1) || s.QPs() != xrcQPs {
			t.Errorf("N=%d P=%d node %d: %d INIs + %d TGTs = %d QPs, want %d + %d = %d", N, P, i, s.INIs, s.TGTs, s.QPs(), P*(N-1), P*(N-1), xrcQPs)
		}
		if s.TGTHandles != tgtHandles {
			t.Errorf("N=%d P=%d node %d: %d TGT handles, want %d", N, P, i, s.TGTHandles, tgtHandles)
		}
		rows = append(rows, fmt.Sprintf("| %d x %d | %d | %d | %d | %d | %d | %d | %d | %.1f |",
			N, P, i, s.INIs, s.TGTs, s.QPs(), s.TGTHandles, handles, rcQPs, float64(rcQPs)/float64(s.QPs())))
	}
	cancel()
	accepting.Wait()
	return rows
}
