package memfabric_test

import (
	"strings"
	"testing"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// TestNilAndZeroFabricAndNodePanicClearly: a Fabric is made by New and a
// Node by a Fabric, and the methods of a nil or zero one panic, as their
// docs say; with a message that names the mistake, not a nil dereference
// deep inside the kernel model.
func TestNilAndZeroFabricAndNodePanicClearly(t *testing.T) {
	var nf *memfabric.Fabric
	var nn *memfabric.Node
	calls := []struct {
		name string
		f    func()
	}{
		{"nil Fabric.Node", func() { nf.Node("10.0.0.1") }},
		{"nil Fabric.AddNode", func() { nf.AddNode("10.0.0.1", memfabric.NodeConfig{}) }},
		{"zero Fabric.Node", func() { new(memfabric.Fabric).Node("10.0.0.1") }},
		{"zero Fabric.AddNode", func() { new(memfabric.Fabric).AddNode("10.0.0.1", memfabric.NodeConfig{}) }},
		{"nil Node.Addr", func() { nn.Addr() }},
		{"nil Node.Process", func() { nn.Process() }},
		{"nil Node.PowerOff", func() { nn.PowerOff() }},
		{"nil Node.FailDevice", func() { nn.FailDevice() }},
		{"nil Node.Stats", func() { nn.Stats() }},
		{"zero Node.Addr", func() { new(memfabric.Node).Addr() }},
		{"zero Node.Process", func() { new(memfabric.Node).Process() }},
		{"zero Node.PowerOff", func() { new(memfabric.Node).PowerOff() }},
		{"zero Node.FailDevice", func() { new(memfabric.Node).FailDevice() }},
		{"zero Node.Stats", func() { new(memfabric.Node).Stats() }},
		{"zero Process's Node.Stats", func() { new(memfabric.Process).Node().Stats() }},
	}
	for _, c := range calls {
		func() {
			defer func() {
				r := recover()
				if s, ok := r.(string); !ok || !strings.HasPrefix(s, "memfabric: ") {
					t.Errorf("%s: panic %v, want one that names the mistake (memfabric: ...)", c.name, r)
				}
			}()
			c.f()
		}()
	}
}
