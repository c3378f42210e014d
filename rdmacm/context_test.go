package rdmacm

import "testing"

func TestContextNil(t *testing.T) {
	var id *ID
	if id.VerbsContext() != nil || (&ID{}).VerbsContext() != nil {
		t.Fatal("Context of a nil or zero ID is not nil")
	}
}
