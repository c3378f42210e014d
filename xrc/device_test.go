package xrc

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// An endpoint without a Process runs on a real device; what cannot name one
// device fails before anything is opened, with an error that says why.
func TestEndpointDeviceConfig(t *testing.T) {
	ctx := context.Background()
	p := memfabric.New().Node("10.0.11.1").Process()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"unspecified v4", Config{Addr: "0.0.0.0:7000"}, "needs a concrete IP"},
		{"unspecified v6", Config{Addr: "[::]:0"}, "needs a concrete IP"},
		{"no port", Config{Addr: "10.0.11.1"}, "10.0.11.1"},
		{"process and device", Config{Process: p, Device: "mlx5_0", Addr: "10.0.11.1:0"}, "not both"},
		{"message size", Config{Process: p, Addr: "10.0.11.1:0", MaxMessageSize: MaxMessageSize + 1}, "max message size"},
		{"receive window", Config{Process: p, Addr: "10.0.11.1:0", RecvWindow: -1}, "receive window"},
	} {
		_, err := NewEndpoint(ctx, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrNoKernel) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want it to match ErrInvalid", tc.name, err)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := NewEndpoint(cancelled, Config{Addr: "10.0.11.1:0"}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

// An address no RDMA device holds (on the host: no RDMA at all) fails,
// naming the address, and leaves no CM id, channel or verbs object behind.
func TestEndpointDeviceMissing(t *testing.T) {
	c0, v0 := rdmacm.Counts(), verbs.Counts()
	_, err := NewEndpoint(context.Background(), Config{Addr: "192.0.2.77:0", DomainDir: t.TempDir() + "/d"})
	if err == nil || !strings.Contains(err.Error(), "192.0.2.77:0") {
		t.Fatalf("an address no device holds: %v", err)
	}
	t.Log(err)
	if c, v := rdmacm.Counts(), verbs.Counts(); c != c0 || v != v0 {
		t.Errorf("left behind: rdmacm %+v, verbs %+v (before: %+v, %+v)", c, v, c0, v0)
	}
}
