// Command rxe-setup creates the soft-RoCE test network inside the test VM
// through package test/softroce: a veth pair (veth0 10.77.0.1/24, veth1
// 10.77.0.2/24, both up) and the rxe device rxe0 on veth0. It prints the
// result as shell assignments for test/vm/rxe-vm.sh to eval:
//
//	RXE_DEV=rxe0
//	RXE_NETDEV=veth0
//	RXE_IP=10.77.0.1
//	RXE_PEER_IP=10.77.0.2
//
// It loads no modules: run `modprobe rdma_rxe veth` first. Needs root.
//
// Equivalent to:
//
//	ip link add veth0 type veth peer name veth1
//	ip addr add 10.77.0.1/24 dev veth0; ip addr add 10.77.0.2/24 dev veth1
//	ip link set veth0 up; ip link set veth1 up
//	rdma link add rxe0 type rxe netdev veth0
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"

	"github.com/goxrc/goxrc/test/softroce"
)

func main() {
	v := softroce.DefaultVeth
	rxe := flag.String("rxe", "rxe0", "name of the rxe device")
	flag.StringVar(&v.Name, "netdev", v.Name, "veth end that carries the rxe device")
	flag.StringVar(&v.Peer, "peer", v.Peer, "other veth end")
	addr := flag.String("addr", v.Addr.String(), "address of -netdev (CIDR)")
	peerAddr := flag.String("peer-addr", v.PeerAddr.String(), "address of -peer (CIDR, empty for none)")
	flag.Parse()

	var err error
	if v.Addr, err = netip.ParsePrefix(*addr); err != nil {
		fail(err)
	}
	v.PeerAddr = netip.Prefix{}
	if *peerAddr != "" {
		if v.PeerAddr, err = netip.ParsePrefix(*peerAddr); err != nil {
			fail(err)
		}
	}
	l, err := softroce.Setup(*rxe, v)
	if err != nil {
		fail(err)
	}
	ip, err := softroce.AddressFor(l.Name)
	if err != nil {
		fail(err)
	}
	fmt.Printf("RXE_DEV=%s\nRXE_NETDEV=%s\nRXE_IP=%s\n", l.Name, l.Netdev, ip)
	if v.PeerAddr.IsValid() {
		fmt.Printf("RXE_PEER_IP=%s\n", v.PeerAddr.Addr())
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "rxe-setup:", err)
	os.Exit(1)
}
