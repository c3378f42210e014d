package softroce

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Environment variables exported by test/vm/rxe-vm.sh in the guest.
const (
	EnvDev    = "RXE_DEV"     // RDMA device name, e.g. rxe0
	EnvNetdev = "RXE_NETDEV"  // network device under it, e.g. veth0
	EnvIP     = "RXE_IP"      // IPv4 address of that netdev, e.g. 10.77.0.1
	EnvPeerIP = "RXE_PEER_IP" // address of the other end of the veth pair, e.g. 10.77.0.2
)

// SysfsRoot is where the kernel lists RDMA devices.
const SysfsRoot = "/sys/class/infiniband"

// ErrUnsupported is returned by the set-up functions on systems other than Linux.
var ErrUnsupported = errors.New("softroce: not supported on this system")

// Link is an RDMA link (device) as listed by `rdma link`.
type Link struct {
	Name     string // e.g. rxe0
	Index    uint32 // kernel device index
	Netdev   string // network device under port 1, "" if unknown
	NodeGUID string
}

// netdevOf finds the network device under port 1 of RDMA device dev in a
// tree laid out like /sys/class/infiniband. rxe devices have a "parent" file;
// every RoCE device lists the netdev of each populated GID entry in
// ports/1/gid_attrs/ndevs/<index>.
func netdevOf(fsys fs.FS, dev string) string {
	if b, err := fs.ReadFile(fsys, path.Join(dev, "parent")); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return s
		}
	}
	dir := path.Join(dev, "ports/1/gid_attrs/ndevs")
	ents, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return ""
	}
	idx := make([]int, 0, len(ents))
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			idx = append(idx, n)
		}
	}
	slices.Sort(idx)
	for _, n := range idx {
		// Unpopulated entries fail to read (EINVAL); the first one that reads wins.
		b, err := fs.ReadFile(fsys, path.Join(dir, strconv.Itoa(n)))
		if s := strings.TrimSpace(string(b)); err == nil && s != "" {
			return s
		}
	}
	return ""
}

// ipv4FromGIDs returns the first IPv4-mapped GID (::ffff:a.b.c.d) of port 1
// of dev, which is how RoCE v2 devices list the IPv4 addresses of their netdev.
func ipv4FromGIDs(fsys fs.FS, dev string) (netip.Addr, bool) {
	if as := ipv4GIDs(fsys, dev); len(as) > 0 {
		return as[0], true
	}
	return netip.Addr{}, false
}

// ipv4GIDs returns the IPv4-mapped GIDs of dev's port 1, in table order.
func ipv4GIDs(fsys fs.FS, dev string) []netip.Addr {
	dir := path.Join(dev, "ports/1/gids")
	ents, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil
	}
	idx := make([]int, 0, len(ents))
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			idx = append(idx, n)
		}
	}
	slices.Sort(idx)
	var out []netip.Addr
	for _, n := range idx {
		b, err := fs.ReadFile(fsys, path.Join(dir, strconv.Itoa(n)))
		if err != nil {
			continue
		}
		if a, ok := parseGIDv4(strings.TrimSpace(string(b))); ok {
			out = append(out, a)
		}
	}
	return out
}

// HasGID reports whether RDMA device dev's port 1 has a GID for IPv4
// address ip: soft-RoCE adds one a moment after the address appears on its
// netdev.
//
// Equivalent to: grep -l ::ffff:IP /sys/class/infiniband/DEV/ports/1/gids/* (in hex)
func HasGID(dev string, ip netip.Addr) bool {
	return slices.Contains(ipv4GIDs(os.DirFS(SysfsRoot), dev), ip.Unmap())
}

// parseGIDv4 parses a GID as sysfs prints it (0000:0000:0000:0000:0000:ffff:0a4d:0001)
// and returns the IPv4 address when it is IPv4-mapped.
func parseGIDv4(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4In6() {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// pickIPv4 returns the first usable IPv4 address (not link-local, not unspecified).
func pickIPv4(addrs []netip.Addr) (netip.Addr, bool) {
	for _, a := range addrs {
		a = a.Unmap()
		if a.Is4() && !a.IsLinkLocalUnicast() && !a.IsUnspecified() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// probe is what Device needs from the system; tests replace it.
type probe struct {
	getenv     func(string) string
	sysfs      func() ([]string, error) // the entries of /sys/class/infiniband: the RDMA devices
	links      func() ([]Link, error)
	addressFor func(string) (netip.Addr, error)
}

var systemProbe = probe{
	getenv: os.Getenv,
	sysfs: func() ([]string, error) {
		ents, err := os.ReadDir(SysfsRoot)
		names := make([]string, len(ents))
		for i, e := range ents {
			names[i] = e.Name()
		}
		return names, err
	},
	links:      Links,
	addressFor: AddressFor,
}

// resolve decides which device a test uses. A non-empty skip means "skip with
// this reason"; a non-nil error means the test must fail.
func (p probe) resolve() (dev string, addr netip.Addr, skip string, err error) {
	dev = p.getenv(EnvDev)
	if dev == "" {
		// No device promised: skip where there is none, or none the tests can
		// use (they speak IPv4); fail where devices are there but cannot be seen.
		devs, serr := p.sysfs()
		switch {
		case errors.Is(serr, fs.ErrNotExist):
			return "", netip.Addr{}, "no RDMA device: " + SysfsRoot + " missing; run through test/vm/rxe-vm.sh", nil
		case serr != nil:
			return "", netip.Addr{}, "", fmt.Errorf("cannot read %s: %w", SysfsRoot, serr)
		case len(devs) == 0:
			return "", netip.Addr{}, "no RDMA device: " + SysfsRoot + " is empty; run through test/vm/rxe-vm.sh", nil
		}
		links, lerr := p.links()
		if lerr != nil {
			return "", netip.Addr{}, "", fmt.Errorf("RDMA devices %q in %s, but RDMA links cannot be listed: %w", devs, SysfsRoot, lerr)
		}
		if len(links) == 0 {
			return "", netip.Addr{}, "", fmt.Errorf("RDMA devices %q in %s, but the kernel lists no RDMA link", devs, SysfsRoot)
		}
		var why []string
		for _, l := range links {
			a, aerr := p.addressFor(l.Name)
			if aerr == nil {
				return l.Name, a, "", nil
			}
			why = append(why, aerr.Error())
		}
		return "", netip.Addr{}, "RDMA devices, but none with an IPv4 address (" + strings.Join(why, "; ") + "); set " + EnvDev + " and " + EnvIP + ", or run through test/vm/rxe-vm.sh", nil
	}

	// RXE_DEV is set: the environment promises a device, so anything missing is a failure.
	links, lerr := p.links()
	if lerr != nil {
		return "", netip.Addr{}, "", fmt.Errorf("%s=%s but RDMA links cannot be listed: %w", EnvDev, dev, lerr)
	}
	if !slices.ContainsFunc(links, func(l Link) bool { return l.Name == dev }) {
		names := make([]string, len(links))
		for i, l := range links {
			names[i] = l.Name
		}
		return "", netip.Addr{}, "", fmt.Errorf("%s=%s but there is no such RDMA device (have: %q)", EnvDev, dev, names)
	}
	if s := p.getenv(EnvIP); s != "" {
		a, perr := netip.ParseAddr(s)
		if perr != nil {
			return "", netip.Addr{}, "", fmt.Errorf("%s=%q: %w", EnvIP, s, perr)
		}
		return dev, a, "", nil
	}
	a, aerr := p.addressFor(dev)
	if aerr != nil {
		return "", netip.Addr{}, "", fmt.Errorf("%s=%s, %s unset and no address found: %w", EnvDev, dev, EnvIP, aerr)
	}
	return dev, a, "", nil
}

// Device returns the RDMA device and the IPv4 address a test should use:
// RXE_DEV and RXE_IP from the environment, or else the first RDMA device
// whose netdev has an IPv4 address.
//
// Without RXE_DEV it skips the test when the machine has no RDMA device
// (/sys/class/infiniband missing or empty), and when it has RDMA devices but
// none with an IPv4 address (the tests speak IPv4); it fails the test when
// /sys/class/infiniband lists devices but the kernel's RDMA links cannot be
// listed (or it lists none), and when /sys/class/infiniband cannot be read.
// With RXE_DEV set, the environment promises a device and anything missing
// fails the test: RDMA links that cannot be listed, no device of that name,
// an RXE_IP that is not an address, no address for the device.
func Device(tb testing.TB) (dev string, addr netip.Addr) {
	tb.Helper()
	dev, addr, skip, err := systemProbe.resolve()
	if err != nil {
		tb.Fatalf("softroce: %v", err)
	}
	if skip != "" {
		tb.Skip(skip)
	}
	return dev, addr
}

// PeerIP returns RXE_PEER_IP, the address of the other end of the veth pair
// in the test VM, or false when it is unset or invalid.
func PeerIP() (netip.Addr, bool) {
	a, err := netip.ParseAddr(os.Getenv(EnvPeerIP))
	return a, err == nil
}

// VethPair describes a veth pair for [SetupVeth] and [Setup].
type VethPair struct {
	Name     string       // end that carries the rxe device, e.g. veth0
	Peer     string       // other end, e.g. veth1
	Addr     netip.Prefix // address of Name, e.g. 10.77.0.1/24
	PeerAddr netip.Prefix // address of Peer, e.g. 10.77.0.2/24; zero for none
}

// DefaultVeth is the pair the test VM sets up.
var DefaultVeth = VethPair{
	Name:     "veth0",
	Peer:     "veth1",
	Addr:     netip.MustParsePrefix("10.77.0.1/24"),
	PeerAddr: netip.MustParsePrefix("10.77.0.2/24"),
}

func (v VethPair) check() error {
	switch {
	case v.Name == "" || v.Peer == "":
		return errors.New("softroce: veth pair needs two names")
	case v.Name == v.Peer:
		return fmt.Errorf("softroce: veth ends must differ (%s)", v.Name)
	case !v.Addr.IsValid():
		return fmt.Errorf("softroce: veth %s needs an address", v.Name)
	}
	return nil
}

// SecondAddress adds a second IPv4 address to the netdev that holds beside,
// unless it is there already, and waits until RDMA device dev has its GID:
// a second node address on one device. The address is beside's with 100
// added to its last byte. It fails the test where that cannot be done.
//
// The address stays, for the tests after this one and other processes: the
// kernel's CM may still send from it after the test (a DREQ's retry, a DREP
// or REJ as a process exits), and soft-RoCE (kernel 6.1) fails that send on
// its QP1 once the address's GID is gone ("rdma_rxe: qp#1 Failed allocating
// skb"), which leaves QP1's receive side in error for good: the device took
// no CM message after it, every later connection on it timing out (seen in
// CI and here, where the guest's health check made the device again).
func SecondAddress(tb testing.TB, dev string, beside netip.Addr) netip.Addr {
	tb.Helper()
	if !beside.Is4() {
		tb.Fatalf("second address beside %v: IPv4 only", beside)
	}
	b := beside.As4()
	b[3] += 100
	ip := netip.AddrFrom4(b)
	if _, err := AddAddress(beside, ip); err != nil && !errors.Is(err, syscall.EEXIST) {
		tb.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !HasGID(dev, ip); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("%s has no GID for %v 5 s after the address was added", dev, ip)
		}
	}
	return ip
}

// ChildOutput is a child test binary's output made fit for the parent's
// log: each line prefixed with "| ", so that the child's "--- PASS" lines are
// not taken for the parent's by whatever counts results (test/lib.sh).
func ChildOutput(out []byte) string {
	s := strings.TrimRight(string(out), "\n")
	return "| " + strings.ReplaceAll(s, "\n", "\n| ")
}
