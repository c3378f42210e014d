//go:build linux

package softroce

import (
	"slices"
	"testing"

	"github.com/vishvananda/netlink/nl"
)

// dumpMessage is one message of a resource dump: the device index, then
// the table of entries, each with the owner's pid (none for 0, a kernel
// object, which names itself instead) and a field before it.
func dumpMessage(table, entry uint16, pids ...uint32) []byte {
	tbl := nl.NewRtAttr(int(table)|0x8000, nil) // NLA_F_NESTED, as the kernel sets it
	for _, pid := range pids {
		e := tbl.AddRtAttr(int(entry)|0x8000, nil)
		e.AddRtAttr(3, nl.Uint32Attr(7)) // a port index, say
		if pid != 0 {
			e.AddRtAttr(rdmaResPID, nl.Uint32Attr(pid))
		} else {
			e.AddRtAttr(rdmaResPID+1, nl.ZeroTerminated("rxe"))
		}
	}
	msg := nl.NewRtAttr(1, nl.Uint32Attr(4)).Serialize() // RDMA_NLDEV_ATTR_DEV_INDEX
	return append(msg, tbl.Serialize()...)
}

func TestResourceOwners(t *testing.T) {
	msgs := [][]byte{
		dumpMessage(19, 20, 101, 0, 102),
		dumpMessage(19, 20),
		dumpMessage(30, 31, 999), // another kind's table: not counted
		dumpMessage(19, 20, 103),
	}
	got, err := resourceOwners(msgs, 19, 20)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint32{101, 0, 102, 103}; !slices.Equal(got, want) {
		t.Errorf("owners %v, want %v", got, want)
	}
	if _, err := resourceOwners([][]byte{{8, 0, 19, 0x80, 1, 2}}, 19, 20); err == nil {
		t.Error("a truncated table parsed")
	}
}
