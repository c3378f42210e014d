package wire

import "fmt"

// Reason says what was wrong with a message.
type Reason uint8

const (
	ReasonShort     Reason = iota + 1 // input ends before the header or the declared length
	ReasonMagic                       // not our private data
	ReasonVersion                     // a version we do not speak
	ReasonType                        // not the expected message type
	ReasonReserved                    // a reserved byte is not zero
	ReasonLength                      // declared length out of range for the type
	ReasonTooLong                     // input longer than any carrier of the type
	ReasonTrailing                    // non-zero bytes after the declared length
	ReasonFlags                       // unknown flag or a flag not allowed here
	ReasonField                       // a field value out of range or inconsistent
	ReasonAppLength                   // app-data length disagrees with the length
)

var reasonNames = [...]string{"", "short", "bad magic", "unsupported version", "unexpected type",
	"reserved not zero", "bad length", "too long", "non-zero padding", "bad flags", "bad field", "bad app-data length"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) && r != 0 {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// RejectReason maps a decode failure to what the acceptor sends back.
func (r Reason) RejectReason() RejectReason {
	if r == ReasonVersion {
		return RejectVersion
	}
	return RejectBadRequest
}

// DecodeError reports an invalid received message.
type DecodeError struct {
	Reason Reason
	Field  string
}

func (e *DecodeError) Error() string {
	return "xrc wire: decode: " + e.Reason.String() + " (" + e.Field + ")"
}

// RejectReason is the REJECT reason to answer this error with.
func (e *DecodeError) RejectReason() RejectReason { return e.Reason.RejectReason() }

// EncodeError reports a message that cannot be encoded: a field out of range,
// too much app data, or a buffer too small.
type EncodeError struct {
	Reason Reason
	Field  string
}

func (e *EncodeError) Error() string {
	return "xrc wire: encode: " + e.Reason.String() + " (" + e.Field + ")"
}

func decErr(r Reason, f string) error { return &DecodeError{Reason: r, Field: f} }

// check is the shared validation result: zero means valid.
type check struct {
	reason Reason
	field  string
}

func (c check) ok() bool { return c.reason == 0 }
func (c check) dec() error {
	if c.ok() {
		return nil
	}
	return &DecodeError{Reason: c.reason, Field: c.field}
}
func (c check) enc() error {
	if c.ok() {
		return nil
	}
	return &EncodeError{Reason: c.reason, Field: c.field}
}
func bad(f string) check      { return check{ReasonField, f} }
func badFlags(f string) check { return check{ReasonFlags, f} }
