// Package harness holds the tests of the shell harness under test/ (the
// result counting of test/lib.sh, test/apt.sh's waiting out the package
// manager's lock, test/vm/guest.sh's health check, test/vm/rxe-vm.sh's
// runs of two checkouts sharing its cache and its stop on SIGTERM, the stop
// of test/run-tests.sh's and test/run-demo.sh's guests on a signal sent to
// the script alone, and of test/vm/rxe-pair.sh's on one sent to its process
// group, test/bench.sh's failure when the Go tests or benchmarks it runs in
// the guest fail, with fakes for the package manager and qemu, and which
// integration tests test/run-tests.sh lets run in two builds at once), run
// on the host with the other tests; and that the docs cite only tests the
// tree has.
package harness
