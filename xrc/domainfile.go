package xrc

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// DomainFileName is the name of the domain file inside its directory.
const DomainFileName = "xrcd"

// DomainFile is the file that names a node's XRC domain: its inode is the
// kernel's key for the XRCD, and its content the random 64-bit domain id that
// identifies the domain on the wire (and catches a recreated file, which is a
// new inode and so a new domain).
type DomainFile struct {
	Path string // the file whose inode keys the XRCD (ibv_open_xrcd opens it)
	ID   uint64 // never 0 (0 on the wire means "unknown")
}

// ErrDomainFile reports a domain directory or file that is unsafe or corrupt.
var ErrDomainFile = errors.New("xrc: bad domain file")

// OpenDomainFile returns the domain file in dir, creating dir (mode 0700)
// and the file (mode 0600, holding a fresh random domain id) if needed. The
// id is written once: creation happens under an exclusive flock of the
// directory with O_CREAT|O_EXCL, so concurrent processes agree on one file
// and one id, and later processes read it (a file they may read but not
// write serves: only an empty one is written). Permissions are the only access
// control on an XRC domain (anyone who can open the file can open any TGT in
// it), so a directory or file readable by others is refused. It waits for
// the lock while another process holds it, until ctx ends (an error
// matching ctx.Err()); a file system without flock locks (NFS, some FUSE
// ones) is refused with ErrDomainFile. The checks hold for the file
// it opened, which it closes: a caller that opens Path again (for
// verbs.Context.OpenXRCD) opens whatever the path names then, which whoever
// can write a parent of dir may have changed; the Endpoint does not reopen
// the path.
func OpenDomainFile(ctx context.Context, dir string) (DomainFile, error) {
	return openDomainFile(ctx, dir)
}

func newDomainID() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id, nil
		}
	}
}

// The content is one line: "goxrc-domain 1 <16 hex digits>\n".
const domainMagic = "goxrc-domain 1 "

func formatDomainID(id uint64) []byte {
	return fmt.Appendf(nil, "%s%016x\n", domainMagic, id)
}

func parseDomainID(b []byte) (uint64, bool) {
	s, ok := strings.CutPrefix(string(b), domainMagic)
	if !ok || len(s) != 17 || s[16] != '\n' {
		return 0, false
	}
	id, err := strconv.ParseUint(s[:16], 16, 64)
	return id, err == nil && id != 0
}

func domainPath(dir string) string { return filepath.Join(dir, DomainFileName) }
