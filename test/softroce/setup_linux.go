//go:build linux

package softroce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// AddLink creates the soft-RoCE device name on network device netdev. The
// rdma_rxe module must be loaded.
//
// Equivalent to: rdma link add NAME type rxe netdev NETDEV
func AddLink(name, netdev string) error {
	if err := netlink.RdmaLinkAdd(name, "rxe", netdev); err != nil {
		return fmt.Errorf("rdma link add %s type rxe netdev %s: %w", name, netdev, err)
	}
	return nil
}

// DeleteLink removes the RDMA link name.
//
// Equivalent to: rdma link delete NAME
func DeleteLink(name string) error {
	if err := netlink.RdmaLinkDel(name); err != nil {
		return fmt.Errorf("rdma link delete %s: %w", name, err)
	}
	return nil
}

// Links lists the RDMA links with the netdev under port 1 where sysfs shows it.
//
// Equivalent to: rdma link show
func Links() ([]Link, error) {
	ls, err := netlink.RdmaLinkList()
	if err != nil {
		return nil, fmt.Errorf("rdma link show: %w", err)
	}
	sys := os.DirFS(SysfsRoot)
	out := make([]Link, 0, len(ls))
	for _, l := range ls {
		out = append(out, Link{
			Name:     l.Attrs.Name,
			Index:    l.Attrs.Index,
			Netdev:   netdevOf(sys, l.Attrs.Name),
			NodeGUID: l.Attrs.NodeGuid,
		})
	}
	return out, nil
}

// AddressFor returns the IPv4 address of the network device behind RDMA
// device dev, falling back to the IPv4-mapped GIDs of its port 1.
//
// Equivalent to: ip -4 addr show dev $(cat /sys/class/infiniband/DEV/parent)
func AddressFor(dev string) (netip.Addr, error) {
	sys := os.DirFS(SysfsRoot)
	nd := netdevOf(sys, dev)
	if nd != "" {
		if l, err := netlink.LinkByName(nd); err == nil {
			if as, err := netlink.AddrList(l, netlink.FAMILY_V4); err == nil {
				ips := make([]netip.Addr, 0, len(as))
				for _, a := range as {
					if ip, ok := netip.AddrFromSlice(a.IP); ok {
						ips = append(ips, ip)
					}
				}
				if ip, ok := pickIPv4(ips); ok {
					return ip, nil
				}
			}
		}
	}
	if ip, ok := ipv4FromGIDs(sys, dev); ok {
		return ip, nil
	}
	if nd == "" {
		return netip.Addr{}, fmt.Errorf("%s: no netdev found in %s/%s and no IPv4 GID", dev, SysfsRoot, dev)
	}
	return netip.Addr{}, fmt.Errorf("%s: netdev %s has no IPv4 address", dev, nd)
}

// AddAddress adds ip, with the prefix length of the IPv4 address beside
// it, to the network device that holds beside, and returns a function that
// removes it again. Soft-RoCE adds a GID for every address of its netdev,
// so the device then answers on ip too: a second node address on one
// device.
//
// Equivalent to: ip addr add IP/LEN dev $(ip -o addr show to BESIDE | cut -d' ' -f2)
func AddAddress(beside, ip netip.Addr) (remove func() error, err error) {
	as, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("ip addr show: %w", err)
	}
	for _, a := range as {
		if got, ok := netip.AddrFromSlice(a.IP); !ok || got.Unmap() != beside {
			continue
		}
		l, err := netlink.LinkByIndex(a.LinkIndex)
		if err != nil {
			return nil, fmt.Errorf("link %d: %w", a.LinkIndex, err)
		}
		ones, _ := a.Mask.Size()
		na := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ones, 32)}}
		if err := netlink.AddrAdd(l, na); err != nil {
			return nil, fmt.Errorf("ip addr add %s/%d dev %s: %w", ip, ones, l.Attrs().Name, err)
		}
		return func() error { return netlink.AddrDel(l, na) }, nil
	}
	return nil, fmt.Errorf("no device holds %s", beside)
}

// Resources returns the resource counts (pd, cq, qp, cm_id, mr, ...) of RDMA device dev.
//
// Equivalent to: rdma resource show DEV
func Resources(dev string) (map[string]uint64, error) {
	rs, err := netlink.RdmaResourceList()
	if err != nil {
		return nil, fmt.Errorf("rdma resource show: %w", err)
	}
	for _, r := range rs {
		if r.Name == dev {
			return r.RdmaResourceSummaryEntries, nil
		}
	}
	return nil, fmt.Errorf("rdma resource show %s: no such device", dev)
}

// resourceKinds are the kernel's resource-tracking dumps ProcessResources
// reads (rdma_netlink.h): the command, the table attribute and its entry
// attribute, by the name `rdma resource` gives the kind.
var resourceKinds = []struct {
	name         string
	cmd          int
	table, entry uint16
}{
	{"qp", 10, 19, 20},
	{"cm_id", 11, 30, 31},
	{"cq", 12, 35, 36},
	{"mr", 13, 40, 41},
	{"pd", 14, 46, 47},
	{"ctx", 22, 86, 87},
	{"srq", 23, 88, 89},
}

// rdmaResPID is RDMA_NLDEV_ATTR_RES_PID: the owner of a user object, the
// thread that made it (task_pid_vnr of the creating task), absent for the
// kernel's own objects.
const rdmaResPID = 28

// ProcessResources counts the objects (qp, cm_id, cq, mr, pd, ctx, srq) that
// process pid holds on RDMA device dev: those the kernel's resource tracking
// names one of its threads as the owner of. Unlike [Resources], it does not
// count other processes' objects or the kernel's own (rxe's GSI QP), so
// tests that run beside each other on one machine each see only theirs; a
// wildcard listener's child ids, made on every device, count for the
// listener's process.
//
// Equivalent to: rdma resource show qp link DEV (cm_id the same; cq, mr,
// pd, ctx and srq with dev DEV), counting the lines whose pid is a thread
// of PID
func ProcessResources(dev string, pid int) (map[string]uint64, error) {
	link, err := netlink.RdmaLinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("rdma link show %s: %w", dev, err)
	}
	counts := make(map[string]uint64, len(resourceKinds))
	for _, k := range resourceKinds {
		req := nl.NewNetlinkRequest(nl.RDMA_NL_NLDEV<<10|k.cmd, unix.NLM_F_DUMP)
		req.AddData(nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, nl.Uint32Attr(link.Attrs.Index)))
		msgs, err := req.Execute(unix.NETLINK_RDMA, 0)
		if err != nil {
			return nil, fmt.Errorf("rdma resource show %s dev %s: %w", k.name, dev, err)
		}
		owners, err := resourceOwners(msgs, k.table, k.entry)
		if err != nil {
			return nil, fmt.Errorf("rdma resource show %s dev %s: %w", k.name, dev, err)
		}
		counts[k.name] = 0
		for _, tid := range owners {
			// The owner is a thread: ours if /proc/PID/task lists it.
			if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d", pid, tid)); err == nil {
				counts[k.name]++
			}
		}
	}
	return counts, nil
}

// resourceOwners returns the owner of each entry of the table attribute in
// a resource dump's messages (0 for the kernel's own objects).
func resourceOwners(msgs [][]byte, table, entry uint16) ([]uint32, error) {
	const typeMask = 0x3fff // without NLA_F_NESTED and NLA_F_NET_BYTEORDER
	var owners []uint32
	for _, m := range msgs {
		attrs, err := nl.ParseRouteAttr(m)
		if err != nil {
			return nil, err
		}
		for _, a := range attrs {
			if a.Attr.Type&typeMask != table {
				continue
			}
			entries, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return nil, err
			}
			for _, e := range entries {
				if e.Attr.Type&typeMask != entry {
					continue
				}
				fields, err := nl.ParseRouteAttr(e.Value)
				if err != nil {
					return nil, err
				}
				var owner uint32
				for _, f := range fields {
					if f.Attr.Type&typeMask == rdmaResPID && len(f.Value) == 4 {
						owner = nl.NativeEndian().Uint32(f.Value)
					}
				}
				owners = append(owners, owner)
			}
		}
	}
	return owners, nil
}

// SetupVeth creates the veth pair v.Name/v.Peer, gives each end its address
// (PeerAddr may be the zero Prefix) and brings both up. Parts that already
// exist are kept, so it can be called again.
//
// Equivalent to:
//
//	ip link add NAME type veth peer name PEER
//	ip addr add ADDR dev NAME; ip addr add PEERADDR dev PEER
//	ip link set NAME up; ip link set PEER up
func SetupVeth(v VethPair) error {
	if err := v.check(); err != nil {
		return err
	}
	err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: v.Name}, PeerName: v.Peer})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ip link add %s type veth peer name %s: %w", v.Name, v.Peer, err)
	}
	for _, end := range []struct {
		name string
		addr netip.Prefix
	}{{v.Name, v.Addr}, {v.Peer, v.PeerAddr}} {
		l, err := netlink.LinkByName(end.name)
		if err != nil {
			return fmt.Errorf("ip link show %s: %w", end.name, err)
		}
		if end.addr.IsValid() {
			ipn := &net.IPNet{IP: end.addr.Addr().AsSlice(), Mask: net.CIDRMask(end.addr.Bits(), end.addr.Addr().BitLen())}
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("ip addr add %s dev %s: %w", end.addr, end.name, err)
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("ip link set %s up: %w", end.name, err)
		}
	}
	return nil
}

// DeleteVeth removes the veth pair that name belongs to (both ends).
//
// Equivalent to: ip link delete NAME
func DeleteVeth(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("ip link delete %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("ip link delete %s: %w", name, err)
	}
	return nil
}

// Setup creates the veth pair v (see [SetupVeth]) and the soft-RoCE device
// rxe on v.Name, and returns the new link. An existing rxe device on v.Name
// is kept.
//
// Equivalent to: SetupVeth's commands, then rdma link add RXE type rxe netdev NAME
func Setup(rxe string, v VethPair) (Link, error) {
	if err := SetupVeth(v); err != nil {
		return Link{}, err
	}
	find := func() (Link, bool) {
		ls, err := Links()
		if err != nil {
			return Link{}, false
		}
		for _, l := range ls {
			if l.Name == rxe {
				return l, true
			}
		}
		return Link{}, false
	}
	if l, ok := find(); ok {
		if l.Netdev == v.Name {
			return l, nil
		}
		return Link{}, fmt.Errorf("rdma link add %s: %s exists on %s, not %s (rdma link delete %s)", rxe, rxe, l.Netdev, v.Name, rxe)
	}
	// rdma link add refuses a second device on a netdev with EEXIST, which
	// names neither: say which one is there.
	if ls, err := Links(); err == nil {
		for _, l := range ls {
			if l.Netdev == v.Name {
				return Link{}, fmt.Errorf("rdma link add %s: %s already carries soft-RoCE device %s (rdma link delete %s)", rxe, v.Name, l.Name, l.Name)
			}
		}
	}
	if err := AddLink(rxe, v.Name); err != nil {
		return Link{}, err
	}
	l, ok := find()
	if !ok {
		return Link{}, fmt.Errorf("rdma link add %s: created but not listed", rxe)
	}
	return l, nil
}
