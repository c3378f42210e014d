// Package harness holds the tests of the shell harness under test/ (the
// result counting of test/lib.sh, and test/apt.sh's waiting out the
// package manager's lock), run on the host with the other tests.
package harness
