//go:build linux

package integration

import (
	"os"
	"slices"
	"testing"

	"github.com/goxrc/goxrc/test/softroce"
)

// needVM skips unless the test VM announced its rxe device.
func needVM(t *testing.T) {
	t.Helper()
	if os.Getenv(softroce.EnvDev) == "" {
		t.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh")
	}
}

func findLink(t *testing.T, name string) (softroce.Link, bool) {
	t.Helper()
	links, err := softroce.Links()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(links, func(l softroce.Link) bool { return l.Name == name })
	if i < 0 {
		return softroce.Link{}, false
	}
	return links[i], true
}

// TestSoftRoCEDevice checks that the harness set up what it exports.
func TestSoftRoCEDevice(t *testing.T) {
	needVM(t)
	dev, addr := softroce.Device(t)
	if want := os.Getenv(softroce.EnvDev); dev != want {
		t.Errorf("Device = %s, RXE_DEV = %s", dev, want)
	}
	if want := os.Getenv(softroce.EnvIP); addr.String() != want {
		t.Errorf("Device address = %s, RXE_IP = %s", addr, want)
	}
	l, ok := findLink(t, dev)
	if !ok {
		t.Fatalf("Links does not list %s", dev)
	}
	if want := os.Getenv(softroce.EnvNetdev); l.Netdev != want {
		t.Errorf("%s: netdev %q, RXE_NETDEV = %q", dev, l.Netdev, want)
	}
	got, err := softroce.AddressFor(dev)
	if err != nil || got != addr {
		t.Errorf("AddressFor(%s) = %v, %v; want %s", dev, got, err, addr)
	}
	res, err := softroce.Resources(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res["qp"]; !ok {
		t.Errorf("Resources(%s) has no qp count: %v", dev, res)
	}
	t.Logf("%s on %s at %s, resources %v", dev, l.Netdev, addr, res)
}

// TestSoftRoCEAddDeleteLink adds and removes a second rxe device on the peer end of the veth pair.
func TestSoftRoCEAddDeleteLink(t *testing.T) {
	needVM(t)
	peer, ok := softroce.PeerIP()
	if !ok {
		t.Fatal("RXE_PEER_IP unset or invalid")
	}
	const name, netdev = "rxe1", "veth1"
	if err := softroce.AddLink(name, netdev); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = softroce.DeleteLink(name)
		}
	})
	l, ok := findLink(t, name)
	if !ok {
		t.Fatalf("Links does not list the new %s", name)
	}
	if l.Netdev != netdev {
		t.Errorf("%s: netdev %q, want %s", name, l.Netdev, netdev)
	}
	if got, err := softroce.AddressFor(name); err != nil || got != peer {
		t.Errorf("AddressFor(%s) = %v, %v; want %s", name, got, err, peer)
	}
	if res, err := softroce.Resources(name); err != nil || len(res) == 0 {
		t.Errorf("Resources(%s) = %v, %v", name, res, err)
	}
	if err := softroce.AddLink(name, netdev); err == nil {
		t.Errorf("second AddLink(%s) succeeded", name)
	}
	if err := softroce.DeleteLink(name); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if _, ok := findLink(t, name); ok {
		t.Errorf("%s still listed after DeleteLink", name)
	}
	if err := softroce.DeleteLink(name); err == nil {
		t.Errorf("DeleteLink of a missing link succeeded")
	}
}
