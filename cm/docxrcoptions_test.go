package cm

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// The options that XRC connections do not take say so, each in its own
// doc, as WithKeepalive and WithBacklog do: xrc.Config has no field for
// them, so over XRC on a device (not only with WithFabric, whose doc lists
// them) they have no effect. WithBusyPoll and WithInlineThreshold said
// nothing of XRC, and a program that asked for XRCPrefer on a device with
// XRC could not learn from their docs that its busy polling was ignored.
func TestDocOptionsXRCHasNoEffect(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "options.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"WithKeepalive": true, "WithBacklog": true, "WithBusyPoll": true, "WithInlineThreshold": true}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || !want[fd.Name.Name] {
			continue
		}
		delete(want, fd.Name.Name)
		if doc := fd.Doc.Text(); !strings.Contains(doc, "XRC") {
			t.Errorf("%s's doc says nothing of XRC connections:\n%s", fd.Name.Name, doc)
		}
	}
	for name := range want {
		t.Errorf("%s not found in options.go", name)
	}
}
