//go:build linux && cgo

package verbs_test

const haveVerbs = true
