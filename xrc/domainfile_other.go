//go:build !unix

package xrc

import (
	"context"
	"os"

	"github.com/goxrc/goxrc/verbs"
)

func openDomainFile(_ context.Context, dir string) (DomainFile, error) {
	return DomainFile{}, &verbs.OpError{Op: "xrc.OpenDomainFile", Addr: dir, Err: verbs.ErrNotSupported}
}

func openDomain(ctx context.Context, dir string) (DomainFile, *os.File, error) {
	d, err := openDomainFile(ctx, dir)
	return d, nil, err
}

func domainFD(f *os.File) string { return f.Name() }
