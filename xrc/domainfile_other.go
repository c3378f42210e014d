//go:build !unix

package xrc

import (
	"context"

	"github.com/goxrc/goxrc/verbs"
)

func openDomainFile(_ context.Context, dir string) (DomainFile, error) {
	return DomainFile{}, &verbs.OpError{Op: "xrc.OpenDomainFile", Addr: dir, Err: verbs.ErrNotSupported}
}
