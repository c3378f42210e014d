package cm

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRemoteRegionRejectsHostileDescriptors(t *testing.T) {
	ok := RemoteRegion{Addr: 0x7f00_0000_1000, Len: 8192, RKey: 0x1234}
	got, err := UnmarshalRemoteRegion(ok.Marshal())
	require.NoError(t, err)
	require.Equal(t, ok, got)

	for _, b := range [][]byte{nil, make([]byte, RemoteRegionLen-1), make([]byte, RemoteRegionLen+1)} {
		_, err := UnmarshalRemoteRegion(b)
		require.Error(t, err, "%d bytes", len(b))
	}
	edge := RemoteRegion{Addr: math.MaxUint64 - 100, Len: 100}
	_, err = UnmarshalRemoteRegion(edge.Marshal())
	require.NoError(t, err, "a region ending at the top of the address space")
	edge.Len++
	_, err = UnmarshalRemoteRegion(edge.Marshal())
	require.ErrorContains(t, err, "wraps")
}

// FuzzUnmarshalRemoteRegion: a descriptor from a peer either fails to
// decode or decodes to a region that does not wrap and marshals back to
// the same bytes.
func FuzzUnmarshalRemoteRegion(f *testing.F) {
	f.Add(RemoteRegion{Addr: 0x7f00_0000_1000, Len: 8192, RKey: 7}.Marshal())
	f.Add(RemoteRegion{Addr: math.MaxUint64, Len: 1}.Marshal())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := UnmarshalRemoteRegion(b)
		if err != nil {
			return
		}
		if r.Addr+uint64(r.Len) < r.Addr {
			t.Fatalf("%+v wraps", r)
		}
		if !bytes.Equal(r.Marshal(), b) {
			t.Fatalf("%x decodes to %+v, which marshals to %x", b, r, r.Marshal())
		}
	})
}
