//go:build !unix

package xrc

import "github.com/goxrc/goxrc/verbs"

func openDomainFile(dir string) (DomainFile, error) {
	return DomainFile{}, &verbs.OpError{Op: "xrc.OpenDomainFile", Addr: dir, Err: verbs.ErrNotSupported}
}
