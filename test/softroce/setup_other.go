//go:build !linux

package softroce

import "net/netip"

// AddLink creates a soft-RoCE device; Linux only.
//
// Equivalent to: rdma link add NAME type rxe netdev NETDEV
func AddLink(name, netdev string) error { return ErrUnsupported }

// DeleteLink removes an RDMA link; Linux only.
//
// Equivalent to: rdma link delete NAME
func DeleteLink(name string) error { return ErrUnsupported }

// Links lists the RDMA links; Linux only.
//
// Equivalent to: rdma link show
func Links() ([]Link, error) { return nil, ErrUnsupported }

// AddressFor returns the IPv4 address behind an RDMA device; Linux only.
func AddressFor(dev string) (netip.Addr, error) { return netip.Addr{}, ErrUnsupported }

// AddAddress adds an address beside another; Linux only.
//
// Equivalent to: ip addr add IP/LEN dev DEV
func AddAddress(beside, ip netip.Addr) (remove func() error, err error) { return nil, ErrUnsupported }

// Resources returns the resource counts of an RDMA device; Linux only.
//
// Equivalent to: rdma resource show DEV
func Resources(dev string) (map[string]uint64, error) { return nil, ErrUnsupported }

// ProcessResources counts a process's objects on an RDMA device; Linux only.
//
// Equivalent to: rdma resource show qp link DEV (and the other kinds), by pid
func ProcessResources(dev string, pid int) (map[string]uint64, error) { return nil, ErrUnsupported }

// SetupVeth creates a veth pair with addresses; Linux only.
func SetupVeth(v VethPair) error { return ErrUnsupported }

// DeleteVeth removes a veth pair; Linux only.
//
// Equivalent to: ip link delete NAME
func DeleteVeth(name string) error { return ErrUnsupported }

// Setup creates a veth pair and a soft-RoCE device on it; Linux only.
func Setup(rxe string, v VethPair) (Link, error) { return Link{}, ErrUnsupported }
