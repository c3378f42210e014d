// Package wire is the versioned private-data codec of the XRC connection
// protocol (docs: xrc-protocol.md, "Private data").
//
// Every message starts with an 8-byte header, network byte order:
//
//	0  magic    uint16  0x5852 ("XR")
//	2  version  uint8   4 (a REJECT always carries 1: its layout is frozen)
//	3  type     uint8   PHYS_REQ=1 VIRT_REQ=2 ACCEPT=3 REJECT=4 FIN=5
//	4  flags    uint8   REQ: RECIPROCAL=1 REPLACES_TGT=2 MOVE=4 ONE_EXCHANGE=8
//	                    ABORT=16;
//	                    ACCEPT: REVERSE=8; FIN: HALF=1
//	5  reserved uint8   must be 0
//	6  length   uint16  whole message length, header included
//
// Bodies (QPNs and SRQNs are 24-bit fields, 3 bytes, as the CM carries them):
//
//	REQ    conn tag u32, peer tag u32, incarnation u64, INI QPN u24,
//	       TGT QPN hint u24, domain hint u64, sender SRQN u24, reply port u16
//	       (never 0), credits u16, max message u32, move u32 (the leg's
//	       move generation: non-zero exactly with MOVE), app length u8, app
//	       data (fixed part 54 bytes)
//	ACCEPT tag echo u32, acceptor tag u32, incarnation u64, TGT QPN u24,
//	       SRQN u24, domain id u64, credits u16, max message u32, app length
//	       u8 (fixed part 45), with REVERSE the reverse leg (tag u32, INI QPN
//	       u24, TGT QPN u24, domain id u64: 18 bytes), then app data
//	REJECT tag u32, reason u8, min version u8, max version u8, reserved u8,
//	       detail u32, domain id u64, app length u8, app data (29)
//	FIN    tag u32 (receiver's), sender tag u32              (16 bytes)
//
// Budgets: a PHYS_REQ travels in a connected-mode REQ (56 bytes), a VIRT_REQ in
// a SIDR REQ (180), an ACCEPT in a REP (196) or SIDR REP (136) and so is kept to
// 136, a REJECT in a REJ (148) or a SIDR REP (136) and so is kept to 136.
// Encoding a message longer than its budget fails.
//
// Decoding treats every byte as untrusted. The kernel pads received private
// data with zeros up to the carrier's maximum, so a decoder reads the header's
// length and ignores the padding; but padding that is not all zero is
// rejected (ReasonTrailing): the kernel never produces it, so it means a
// confused or hostile sender, and strictness keeps decode∘encode exact (a
// decoded message re-encodes to the same bytes). Input longer than the largest
// carrier of that type is rejected too. Errors are *DecodeError values whose
// RejectReason says what to send back.
//
// Encoding writes into a caller buffer and never allocates; decoding fills a
// caller struct (app data lives in fixed arrays) and does not allocate on
// success.
package wire
