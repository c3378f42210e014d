package cm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFrameRoundTrip(t *testing.T) {
	b := make([]byte, 64)
	h := frameHeader{kind: frameData, flags: flagImm, credits: 7, seq: 42}
	h.put(b)
	got, err := parseFrame(b, 20, 42, 56, 16)
	require.NoError(t, err)
	require.Equal(t, h, got)
}

func TestFrameRejectsGarbage(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    frameHeader
		n    int
		want string
	}{
		{"short", frameHeader{kind: frameData, seq: 1}, 7, "shorter than its header"},
		{"unknown kind", frameHeader{kind: 9, seq: 1}, 8, "unknown frame kind"},
		{"flags", frameHeader{kind: frameData, flags: 0x80, seq: 1}, 8, "unknown frame flags"},
		{"sequence gap", frameHeader{kind: frameData, seq: 3}, 8, "sequence 3, want 1"},
		{"credits", frameHeader{kind: frameCredit, credits: 17, seq: 1}, 8, "17 credits"},
		{"payload on credit", frameHeader{kind: frameCredit, seq: 1}, 9, "control frame"},
		{"too long", frameHeader{kind: frameData, seq: 1}, 8 + 57, "exceeds the agreed maximum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, 128)
			tc.h.put(b)
			_, err := parseFrame(b, tc.n, 1, 56, 16)
			require.ErrorIs(t, err, ErrProtocol)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestHelloRoundTripAndPadding(t *testing.T) {
	h := hello{queueDepth: 64, maxMessage: 4096}
	b := h.marshal()
	padded := append(bytes.Clone(b), make([]byte, 56-len(b))...) // as the kernel delivers it
	got, err := parseHello(padded)
	require.NoError(t, err)
	require.Equal(t, h, got)
}

func TestHelloRejectsHostileFields(t *testing.T) {
	good := hello{queueDepth: 64, maxMessage: 4096}.marshal()
	mutate := func(f func(b []byte)) []byte { b := append(bytes.Clone(good), make([]byte, 40)...); f(b); return b }
	for name, b := range map[string][]byte{
		"short":       good[:10],
		"magic":       mutate(func(b []byte) { b[0] = 'X' }),
		"version":     mutate(func(b []byte) { b[4] = 2 }),
		"length":      mutate(func(b []byte) { b[5] = 99 }),
		"reserved":    mutate(func(b []byte) { b[7] = 1 }),
		"depth 0":     mutate(func(b []byte) { b[8], b[9] = 0, 0 }),
		"huge msg":    mutate(func(b []byte) { b[12] = 0xff }),
		"trailing":    mutate(func(b []byte) { b[30] = 1 }),
		"empty":       nil,
		"zero padded": make([]byte, 56),
	} {
		_, err := parseHello(b)
		require.True(t, errors.Is(err, ErrProtocol), "%s: %v", name, err)
	}
}

func FuzzParseHello(f *testing.F) {
	f.Add(hello{queueDepth: 64, maxMessage: 4096}.marshal())
	f.Add(make([]byte, 56))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			return
		}
		// Anything accepted re-encodes to the same meaningful bytes.
		require.Equal(t, b[:helloLen], h.marshal())
	})
}

func FuzzParseFrame(f *testing.F) {
	b := make([]byte, 16)
	frameHeader{kind: frameData, credits: 3, seq: 5}.put(b)
	f.Add(b, 16, uint32(5))
	f.Fuzz(func(t *testing.T, b []byte, n int, seq uint32) {
		if n < 0 || n > len(b) {
			return
		}
		h, err := parseFrame(b, n, seq, 64, 32)
		if err != nil {
			return
		}
		out := make([]byte, frameHeaderLen)
		h.put(out)
		require.Equal(t, b[:frameHeaderLen], out)
		require.LessOrEqual(t, int(h.credits), 32)
	})
}
