package main

import "testing"

func TestUnspecified(t *testing.T) {
	for addr, want := range map[string]bool{
		"0.0.0.0:7471":       true,
		"[::]:7471":          true,
		":7471":              true,
		"10.77.0.1:7471":     false,
		"[fd00::1]:7471":     false,
		"localhost:7471":     false,
		"no port":            false,
		"[::ffff:0.0.0.0]:1": true,
	} {
		if got := unspecified(addr); got != want {
			t.Errorf("unspecified(%q) = %v, want %v", addr, got, want)
		}
	}
}
