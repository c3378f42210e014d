//go:build linux && cgo

package verbs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// Every DeviceCap constant is the bit of the ibv_device_cap_flags value of
// the same name (case and underscores aside: DeviceNNotifyCQ is
// IBV_DEVICE_N_NOTIFY_CQ), and every DeviceCap constant declared in types.go
// has its pair in deviceCapsC (a new one without is reported).
func TestDeviceCapsMatchVerbsH(t *testing.T) {
	paired := map[string]bool{}
	for _, c := range deviceCapsC {
		if paired[c.goName] {
			t.Errorf("%s paired twice", c.goName)
		}
		paired[c.goName] = true
		if fold(c.goName) != "device"+fold(strings.TrimPrefix(c.c, "IBV_DEVICE_")) {
			t.Errorf("%s is paired with %s, whose name it does not spell", c.goName, c.c)
		}
		if uint64(c.goVal) != c.cVal {
			t.Errorf("%s = %#x, but %s in <infiniband/verbs.h> is %#x", c.goName, uint64(c.goVal), c.c, c.cVal)
		}
	}
	f, err := parser.ParseFile(token.NewFileSet(), "types.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "DeviceCap" {
				continue
			}
			for _, n := range v.Names {
				declared++
				if !paired[n.Name] {
					t.Errorf("DeviceCap %s has no ibv_device_cap_flags pair in deviceCapsC", n.Name)
				}
			}
		}
	}
	if declared != len(deviceCapsC) {
		t.Errorf("types.go declares %d DeviceCap constants, deviceCapsC pairs %d", declared, len(deviceCapsC))
	}
}

// fold lowers s and drops its underscores.
func fold(s string) string { return strings.ReplaceAll(strings.ToLower(s), "_", "") }
