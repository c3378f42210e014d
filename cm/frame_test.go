package cm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, h := range []frameHeader{
		{kind: frameData, flags: flagImm | flagStarved, credits: 7, seq: 42},
		{kind: frameCredit, credits: maxFrameCredits, seq: 0xffff},
		{kind: frameFin},
	} {
		n := 0
		if h.kind == frameData {
			n = 20
		}
		got, err := parseFrame(h.imm(), true, n, h.seq, 56, maxFrameCredits)
		require.NoError(t, err)
		require.Equal(t, h, got)
	}
}

func TestFrameRejectsGarbage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		h     frameHeader
		n     int
		noImm bool
		want  string
	}{
		{"no header", frameHeader{kind: frameData, seq: 1}, 8, true, "without a header"},
		{"unknown kind", frameHeader{kind: 0, seq: 1}, 8, false, "unknown frame kind"},
		{"sequence gap", frameHeader{kind: frameData, seq: 3}, 8, false, "sequence 3, want 1"},
		{"credits", frameHeader{kind: frameCredit, credits: 17, seq: 1}, 0, false, "17 credits"},
		{"payload on credit", frameHeader{kind: frameCredit, seq: 1}, 9, false, "control frame"},
		{"too long", frameHeader{kind: frameData, seq: 1}, 57, false, "exceeds the agreed maximum"},
		{"short imm", frameHeader{kind: frameData, flags: flagImm, seq: 1}, 3, false, "too short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFrame(tc.h.imm(), !tc.noImm, tc.n, 1, 56, 16)
			require.ErrorIs(t, err, ErrProtocol)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestHelloRoundTripAndPadding(t *testing.T) {
	h := hello{queueDepth: 64, maxMessage: 4096, probe: probeTarget{addr: 0x7f00_1234_5000, rkey: 0xabcdef}}
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
		"version 1":   mutate(func(b []byte) { b[4] = 1 }),
		"version 3":   mutate(func(b []byte) { b[4] = 3 }),
		"probe wraps": mutate(func(b []byte) { copy(b[16:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf9}) }),
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
	f.Add(hello{queueDepth: 8, maxMessage: 1 << 20, probe: probeTarget{addr: 1 << 47, rkey: 7}}.marshal())
	f.Add(make([]byte, 56))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		// Exact refusal: the hello.go layout read from b, independently of
		// the parser, is accepted exactly when it is that layout (magic,
		// version, length, zero reserved bits), zero padded and valid.
		documented := len(b) >= helloLen && bytes.Count(b[helloLen:], []byte{0}) == len(b)-helloLen
		if documented {
			be := func(p []byte) (v uint64) {
				for _, c := range p {
					v = v<<8 | uint64(c)
				}
				return v
			}
			want := hello{queueDepth: uint16(be(b[8:10])), maxMessage: uint32(be(b[12:16])),
				probe: probeTarget{addr: be(b[16:24]), rkey: uint32(be(b[24:28]))}}
			documented = bytes.Equal(b[:helloLen], helloLayout(want)) && helloValid(want)
			if documented && (err != nil || h != want) {
				t.Fatalf("%x is a valid hello %+v, parsed as %+v, %v", b, want, h, err)
			}
		}
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("refused with %v, not ErrProtocol", err)
			}
			return
		}
		if !documented {
			t.Fatalf("%x accepted as %+v, but it is not a valid hello", b, h)
		}
		// Anything accepted re-encodes to the same meaningful bytes.
		require.Equal(t, b[:helloLen], h.marshal())
	})
}

func FuzzParseFrame(f *testing.F) {
	f.Add(frameHeader{kind: frameData, credits: 3, seq: 5}.imm(), true, 16, uint16(5), 64, 32)
	f.Add(frameHeader{kind: frameData, flags: flagImm, seq: 9}.imm(), true, 68, uint16(9), 64, 32)
	f.Add(frameHeader{kind: frameCredit, credits: 2, seq: 1}.imm(), true, 0, uint16(1), 4096, 2)
	f.Fuzz(func(t *testing.T, imm uint32, hasImm bool, n int, seq uint16, maxPayload, maxCredits int) {
		// Exact refusal: accepted exactly when frameRule (frame.go's
		// contract, written out) allows it, whatever the limits.
		checkFrame(t, imm, hasImm, n, seq, maxPayload, maxCredits)
		h, err := parseFrame(imm, hasImm, n, seq, maxPayload, maxCredits)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("refused with %v, not ErrProtocol", err)
			}
			return
		}
		// Whatever is accepted is well-formed, within the connection's
		// limits, in sequence, and re-encodes to itself.
		require.True(t, hasImm)
		require.Equal(t, imm, h.imm())
		require.Equal(t, seq, h.seq)
		require.LessOrEqual(t, int(h.credits), maxCredits)
		require.GreaterOrEqual(t, n, 0)
		payload := n
		switch h.kind {
		case frameData:
			if h.flags&flagImm != 0 {
				require.GreaterOrEqual(t, n, userImmLen)
				payload -= userImmLen
			}
		case frameCredit, frameFin:
			require.Zero(t, n, "a control frame with a payload")
			require.Zero(t, h.flags&flagImm)
		default:
			t.Fatalf("kind %d accepted", h.kind)
		}
		require.LessOrEqual(t, payload, maxPayload)
	})
}
