// Package integration holds goxrc's tests against real RDMA. They need a
// soft-RoCE device and run in the qemu guest of test/vm/rxe-vm.sh; on a host
// without RDMA they skip (see test/softroce.Device).
//
// test/run-tests.sh builds this package with `go test -c` on the host and
// runs the binary in the guest with -test.v. To run one test by hand (as root):
//
//	go test -c -o /tmp/integration.test ./test/integration
//	test/vm/rxe-vm.sh /tmp/integration.test -test.v -test.run TestSoftRoCE
package integration
