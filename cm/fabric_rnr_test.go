package cm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// net/http over XRC between nodes whose SRQs hold two receives each
// (memfabric.NodeConfig.SRQReceives): bursts find the SRQs empty and wait
// at their INIs (RNR, retried for ever) until the receiver takes what came.
// Concurrent POSTs of bodies many messages long, from two client processes
// (each one's connections on its one uplink), come back whole.
func TestFabricHTTPWithFewReceives(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newFabric(t)
	srvNode := f.AddNode("10.1.5.1", memfabric.NodeConfig{SRQReceives: 2})
	cliNode := f.AddNode("10.1.5.2", memfabric.NodeConfig{SRQReceives: 2})
	opts := []Option{WithMessageSize(1024), WithQueueDepth(16)}
	l, err := Listen(ctx, "10.1.5.1:80", append([]Option{WithFabric(srvNode.Process()),
		WithDomainPath(filepath.Join(t.TempDir(), "xrc"))}, opts...)...)
	require.NoError(t, err)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// All of the body first: HTTP/1 may close it once the response's
		// headers are flushed.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(body)
	})}
	go hs.Serve(l.NetListener())
	t.Cleanup(func() { hs.Close() })

	domain := filepath.Join(t.TempDir(), "xrc")
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for c := range 2 {
		d := &Dialer{Options: append([]Option{WithFabric(cliNode.Process()), WithDomainPath(domain)}, opts...)}
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "rdma", addr)
		}}}
		t.Cleanup(hc.CloseIdleConnections)
		for r := range 8 {
			wg.Go(func() {
				body := bytes.Repeat([]byte(fmt.Sprintf("client %d request %d;", c, r)), 2000) // about 40 KiB
				resp, err := hc.Post("http://10.1.5.1:80/", "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					errs <- err
					return
				}
				defer resp.Body.Close()
				got, err := io.ReadAll(resp.Body)
				if err == nil && !bytes.Equal(got, body) {
					err = fmt.Errorf("client %d request %d: %d bytes back, want %d, not the same", c, r, len(got), len(body))
				}
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Positive(t, srvNode.Stats().RNRNAKs+cliNode.Stats().RNRNAKs, "no SRQ ran out of receives: the test tested nothing")
	t.Logf("server node %+v, client node %+v", srvNode.Stats(), cliNode.Stats())
}
