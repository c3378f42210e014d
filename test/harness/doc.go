// Package harness holds the tests of the shell harness under test/ (the
// result counting of test/lib.sh), run on the host with the other tests.
package harness
