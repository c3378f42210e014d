// Package rdmaaddr maps between IP addresses and the RDMA devices that hold
// them, for package cm (WithDevice) and package xrc (Config.Device). Both
// directions use the RDMA stack itself, not the network configuration: the
// CM's bind decides which device an address belongs to, and a RoCE device's
// GID table lists the addresses of the netdevs under it.
//
// The package builds everywhere; without Linux and cgo every call fails
// with an error matching verbs.ErrNotSupported.
package rdmaaddr

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// DeviceOf returns the name of the RDMA device that holds ip: it binds a CM
// id on a fresh event channel to ip and reads the device the CM attached it
// to. Everything it opens is closed before it returns.
func DeviceOf(ip netip.Addr) (_ string, err error) {
	if !ip.IsValid() || ip.IsUnspecified() {
		return "", fmt.Errorf("no device for the unspecified address %v: name a concrete IP", ip)
	}
	ch, err := rdmacm.NewEventChannel()
	if errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.ENOENT) {
		// The kernel has no RDMA CM at all: the platform lacks RDMA, which
		// xrc's NewEndpoint reports as ErrNotSupported, as cm does.
		return "", fmt.Errorf("%w: no RDMA here (%w)", verbs.ErrNotSupported, err)
	}
	if err != nil {
		return "", err
	}
	defer func() { err = errors.Join(err, ch.Close()) }()
	id, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	if err != nil {
		return "", err
	}
	defer func() { err = errors.Join(err, id.Close()) }()
	if err := id.Bind(netip.AddrPortFrom(ip.Unmap(), 0)); err != nil {
		return "", err
	}
	name := id.DeviceName()
	if name == "" {
		return "", fmt.Errorf("no RDMA device holds %v", ip)
	}
	return name, nil
}

// AddrOf returns an address of RDMA device name in the family of like:
// binding to it makes the CM use that device. It reads the device's GID
// table, where RoCE keeps the addresses of the netdevs under the device.
func AddrOf(name string, like netip.Addr) (netip.Addr, error) {
	vctx, err := verbs.OpenDevice(name)
	if err != nil {
		if _, lerr := verbs.Devices(); errors.Is(lerr, verbs.ErrNotSupported) {
			// The kernel has no RDMA at all (no uverbs devices), which
			// OpenDevice calls an unknown name (ENODEV): the platform
			// lacks RDMA, as DeviceOf says.
			return netip.Addr{}, fmt.Errorf("%w: no RDMA here (%w)", verbs.ErrNotSupported, lerr)
		}
		return netip.Addr{}, err
	}
	defer vctx.Close()
	attr, err := vctx.QueryDevice()
	if err != nil {
		return netip.Addr{}, err
	}
	var linkLocal netip.Addr
	for port := 1; port <= attr.PhysPortCnt; port++ {
		gids, err := vctx.GIDs(uint8(port))
		if err != nil {
			continue
		}
		for _, g := range gids {
			ip := netip.AddrFrom16(g.GID).Unmap()
			if ip.IsUnspecified() || ip.Is4() != like.Is4() {
				continue
			}
			if ip.IsLinkLocalUnicast() {
				// Not the device's alone (every link has one, and it
				// needs its zone): named in the error, for the caller
				// to give with its zone.
				if !linkLocal.IsValid() && g.Netdev != "" {
					linkLocal = ip.WithZone(g.Netdev)
				}
				continue
			}
			return ip, nil
		}
	}
	if linkLocal.IsValid() {
		return netip.Addr{}, fmt.Errorf("device %s has no IPv6 address but its link-local one, %v: give that, zone and all", name, linkLocal)
	}
	family := "IPv6"
	if like.Is4() {
		family = "IPv4"
	}
	return netip.Addr{}, fmt.Errorf("device %s has no %s address", name, family)
}
