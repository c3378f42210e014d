// Package softroce sets up and finds soft-RoCE (rdma_rxe) devices for goxrc's
// integration tests.
//
// The development and CI hosts have no RDMA at all. Real RDMA runs in a qemu
// guest started by test/vm/rxe-vm.sh, which loads rdma_rxe, creates a veth
// pair (veth0 10.77.0.1/24, veth1 10.77.0.2/24) and an rxe device rxe0 on
// veth0 with the rxe-setup program (test/cmd/rxe-setup, built on this
// package), and exports
//
//	RXE_DEV=rxe0 RXE_NETDEV=veth0 RXE_IP=10.77.0.1 RXE_PEER_IP=10.77.0.2
//
// to the command it runs. Use RXE_IP for both the server and the client: rxe
// loops packets to its own address back internally, and RDMA CM cannot
// resolve routes on an rxe device bound to lo.
//
// Tests get the device with [Device]. Without RXE_DEV it skips the test when
// the machine has no RDMA device (/sys/class/infiniband missing or empty: the
// plain host `go test ./...` case) and when it has RDMA devices but none with
// an IPv4 address, which the tests need; it fails the test when
// /sys/class/infiniband lists devices that the kernel's RDMA links (netlink)
// do not show. With RXE_DEV set, the environment promises a device: it fails
// the test when that device, or its address, is not there:
//
//	func TestConnect(t *testing.T) {
//		dev, addr := softroce.Device(t)
//		// ... listen on addr with rdmacm, open dev with verbs ...
//	}
//
// The set-up functions ([AddLink], [DeleteLink], [Links], [SetupVeth],
// [AddressFor], [Resources], [ProcessResources]) speak netlink directly (no
// rdma or ip binary needed, and no fork, which costs 50-80 ms in the emulated
// guest). They need Linux and CAP_NET_ADMIN; elsewhere they return
// [ErrUnsupported]. The package is pure Go (no cgo).
package softroce
