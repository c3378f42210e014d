package memfabric

import (
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

func TestNodeIsKeyedByAddress(t *testing.T) {
	f := New()
	a, b := f.Node("10.1.0.1"), f.Node("10.1.0.1")
	if a != b {
		t.Fatal("two nodes for one address")
	}
	if f.Node("10.1.0.2") == a {
		t.Fatal("one node for two addresses")
	}
	if a.Addr().String() != "10.1.0.1" {
		t.Fatal(a.Addr())
	}
}

func TestNodePanicsOnBadAddress(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	New().Node("not-an-ip")
}

func TestProcessCarriesKernel(t *testing.T) {
	n := New().Node("10.1.0.1")
	p := n.Process()
	k, ok := kernel.Unwrap(p)
	if !ok || k.LocalAddr() != n.Addr() || !k.XRC() {
		t.Fatalf("Unwrap: %v %v", k, ok)
	}
	if _, ok := kernel.Unwrap(&Process{}); ok {
		t.Fatal("an empty Process unwrapped")
	}
	if p.Node() != n {
		t.Fatal("Node")
	}
	d, err := k.OpenXRCD("", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := k.CreateTGT(d); err != nil {
		t.Fatal(err)
	}
	if s := n.Stats(); s.TGTs != 1 || s.TGTHandles != 1 || s.QPs() != 1 || s.XRCDs != 1 || p.Handles() != 2 {
		t.Fatalf("%+v handles %d", s, p.Handles())
	}
	p.Kill()
	if s := n.Stats(); s != (NodeStats{}) || p.Handles() != 0 {
		t.Fatalf("after kill: %+v handles %d", s, p.Handles())
	}
}

func TestAddNodeConfigAndDuplicates(t *testing.T) {
	f := New()
	n := f.AddNode("10.3.0.1", NodeConfig{SendQueueDepth: 4})
	if f.Node("10.3.0.1") != n {
		t.Fatal("Node did not return the node AddNode added")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("AddNode of an existing node did not panic")
		}
	}()
	f.AddNode("10.3.0.1", NodeConfig{})
}
