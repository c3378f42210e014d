// Package testenv holds facts about the test binary's build that tests
// across packages need, such as whether the race detector is built in.
package testenv
