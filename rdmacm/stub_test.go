//go:build !linux || !cgo

package rdmacm

import (
	"errors"
	"testing"
)

func TestStubNotSupported(t *testing.T) {
	_, err := NewEventChannel()
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("NewEventChannel: %v, want ErrNotSupported", err)
	}
}
